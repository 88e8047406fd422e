"""What a bench ran on and with which model: the device line every bench prints first, and
the model a bench's ``--model`` names (a ``conf/model`` option or a local folder)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"
#: LoRA settings for a bare local folder (the SmolLM2 option's)
FOLDER_LORA = {"lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
               "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
SHRINKABLE = ("tiny", "llama3_1b_shape")


def add_model_args(parser: Any, default: str = "smollm2") -> None:
    """``--model``, ``--device``, ``--hidden``, ``--layers``: the same in every bench."""
    parser.add_argument("--model", default=default,
                        help="a conf/model option (smollm2, tiny, llama3_1b, llama3_1b_shape: "
                             "random weights, speed only) or a local Hugging Face folder")
    parser.add_argument("--device", default="auto", help="cpu | cuda | auto (CUDA when present)")
    parser.add_argument("--hidden", type=int, default=0,
                        help="shrink tiny/llama3_1b_shape to this hidden size (tests)")
    parser.add_argument("--layers", type=int, default=0,
                        help="shrink tiny/llama3_1b_shape to this many layers (tests)")


def model_options() -> list[str]:
    """The ``conf/model`` option names."""
    return sorted(p.stem for p in CONF_MODEL.glob("*.yaml"))


def bench_model_cfg(model: str, hidden_size: int | None = None, num_layers: int | None = None,
                    dtype: str | None = None) -> dict[str, Any]:
    """The model config a bench loads: ``conf/model/<model>.yaml``, or ``model.source=hf`` on a
    local folder; ``hidden_size``/``num_layers`` shrink the tiny and 1B-shaped models."""
    from omegaconf import OmegaConf

    file = CONF_MODEL / f"{model}.yaml"
    if file.is_file():
        cfg: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    elif Path(os.path.expanduser(model)).is_dir():
        cfg = {"source": "hf", "name_or_path": os.path.expanduser(model),
               "cache_dir": "~/.cache/atlas", "dtype": "auto", **FOLDER_LORA}
    else:
        raise ValueError(f"--model={model!r} is neither a conf/model option "
                         f"({', '.join(model_options())}) nor a local folder")
    if hidden_size or num_layers:
        if cfg["source"] not in SHRINKABLE:
            raise ValueError(f"--hidden/--layers shrink only {' or '.join(SHRINKABLE)}, not "
                             f"--model={model}")
        if hidden_size:
            cfg["hidden_size"] = int(hidden_size)
        if num_layers:
            cfg["num_layers"] = int(num_layers)
    if dtype:
        cfg["dtype"] = dtype
    return cfg


def speed_only(cfg: dict[str, Any]) -> bool:
    """True for random weights at a real model's shape: its tokens/s count, its text does not."""
    return cfg.get("source") == "llama3_1b_shape"


def model_label(model: str, cfg: dict[str, Any]) -> str:
    """The model as a bench prints it, labelled when its weights are random."""
    # deferred: loads torch and transformers; every bench's --help imports this module
    from atlas.agent.model import SPEED_ONLY

    shrink = ", ".join(f"{k}={cfg[k]}" for k in ("hidden_size", "num_layers", "num_heads")
                       if cfg.get(k))
    text = f"{model}" + (f" ({shrink})" if shrink else "")
    return f"{text}: {SPEED_ONLY}" if speed_only(cfg) else text


def resolve_bench_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``auto`` (CUDA when present); a missing GPU is an error, not a
    silent CPU run."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device={device}: torch {torch.__version__} sees no CUDA device "
                         "(a CPU build of torch, or no GPU here); use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise SystemExit(f"--device={device!r} is unknown; use cpu, cuda or auto")
    return device


def device_info(device: str) -> dict[str, Any]:
    """Device name, torch, CUDA and cuDNN versions: what every bench prints first."""
    import torch

    # deferred: loads torch; every bench's --help imports this module
    from atlas.agent.precision import cpu_features, cpu_model

    info: dict[str, Any] = {"device": device, "torch": torch.__version__,
                            "cuda": torch.version.cuda or "none (CPU build of torch)",
                            "python": platform.python_version()}
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        info["name"] = torch.cuda.get_device_name(idx)
        info["cudnn"] = torch.backends.cudnn.version()
        info["memory_gb"] = round(torch.cuda.get_device_properties(idx).total_memory / 2**30, 1)
    else:
        feats = cpu_features()
        bf16 = "yes" if feats["avx512_bf16"] or feats["amx_tile"] else "no"
        info["name"] = f"{cpu_model()} ({feats['capability']}, native bf16 {bf16})"
        info["threads"] = torch.get_num_threads()
    return info


def device_line(info: dict[str, Any]) -> str:
    extra = (f", cuDNN {info['cudnn']}, {info['memory_gb']} GiB" if "cudnn" in info
             else f", {info.get('threads')} torch threads")
    return (f"device: {info['device']} = {info['name']}{extra}; torch {info['torch']}, "
            f"CUDA {info['cuda']}, Python {info['python']}")
