"""Two LoRA adapters on one base model: ``policy`` (trained) and ``ref`` (frozen reference).

EvoTune's fixed reference is the base model (adapters disabled); EvoDPO's reference is the
``ref`` adapter, moved forward by copying the policy's adapter tensors (``promote``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

POLICY = "policy"
REF = "ref"
#: the folders ``export_peft`` writes, one per adapter
PEFT_FOLDERS = {POLICY: "policy", REF: "reference"}


def attach_adapters(model: PreTrainedModel, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                    targets: list[str] | tuple[str, ...] = ("q_proj", "v_proj")) -> PeftModel:
    """Wrap ``model`` with a trainable ``policy`` adapter and a frozen ``ref`` copy of it."""
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                     bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg, adapter_name=POLICY)
    peft_model.add_adapter(REF, cfg)
    copy_adapter(peft_model, POLICY, REF)
    use_adapter(peft_model, POLICY)
    return peft_model


def adapter_params(model: PeftModel, name: str) -> dict[str, torch.nn.Parameter]:
    """Parameters of one adapter, keyed by their name with the adapter name removed."""
    tag = f".{name}."
    return {n.replace(tag, "."): p for n, p in model.named_parameters() if tag in n and "lora_" in n}


def get_adapter_state(model: PeftModel, name: str) -> dict[str, torch.Tensor]:
    """A detached CPU copy of an adapter's tensors (a checkpoint or a C_k candidate)."""
    return {k: p.detach().to("cpu", copy=True) for k, p in adapter_params(model, name).items()}


def adds_nothing(state: dict[str, torch.Tensor]) -> bool:
    """Whether an adapter state computes the base model exactly: every LoRA up-projection
    (``lora_B``, zero at initialisation) is zero, so each layer adds ``B @ A @ x = 0``."""
    ups = [t for k, t in state.items() if "lora_B" in k]
    return bool(ups) and all(not bool(t.any()) for t in ups)


@torch.no_grad()
def set_adapter_state(model: PeftModel, name: str, state: dict[str, torch.Tensor]) -> None:
    """Overwrite an adapter's tensors in place (shapes must match)."""
    params = adapter_params(model, name)
    missing = set(params) - set(state)
    if missing:
        raise KeyError(f"adapter state lacks {len(missing)} tensors, e.g. {sorted(missing)[:2]}")
    for k, p in params.items():
        p.copy_(state[k].to(p.device, p.dtype))


def promote(model: PeftModel, state: dict[str, torch.Tensor]) -> None:
    """ref <- ``state`` (tensors copied; the policy adapter is not touched).

    The one place a promotion writes the reference: ``FineTuner`` promotes the gate's
    accepted candidate as soon as the gate and the inspector decide. Restoring a checkpoint sets both adapters directly; that is
    not a promotion.
    """
    if not isinstance(state, dict) or not state:
        raise TypeError("state: promote needs a non-empty adapter state dict "
                        "(GateDecision.promoted_state(C_k) or PolicyCandidate.state)")
    set_adapter_state(model, REF, state)


def copy_adapter(model: PeftModel, src: str, dst: str) -> None:
    """Copy adapter ``src`` into ``dst`` (``attach_adapters`` starts ``ref`` as the policy)."""
    set_adapter_state(model, dst, get_adapter_state(model, src))


def use_adapter(model: PeftModel, name: str) -> None:
    """Activate an adapter for forward passes; only ``policy`` ever requires grad."""
    model.base_model.set_adapter(name)
    for adapter in (POLICY, REF):
        for p in adapter_params(model, adapter).values():
            p.requires_grad_(adapter == POLICY)


@contextmanager
def adapter(model: PeftModel, name: str | None) -> Iterator[PeftModel]:
    """Run a block under adapter ``name`` (``None``: the base model, adapters disabled)."""
    if name is None:
        with model.disable_adapter():
            yield model
        return
    previous = model.active_adapter
    use_adapter(model, name)
    try:
        yield model
    finally:
        use_adapter(model, previous if isinstance(previous, str) else POLICY)


def export_peft(model: PeftModel, folder: str | Path) -> dict[str, Path]:
    """Write ``policy`` and ``ref`` as plain PEFT adapter folders, ``folder/policy`` and
    ``folder/reference``: each loads with ``PeftModel.from_pretrained(base_model, path)`` over
    the base model the run loaded, with no atlas code. An earlier export is replaced."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=folder))
    try:  # peft writes a non-default adapter to <dir>/<adapter name>
        model.save_pretrained(str(tmp), selected_adapters=list(PEFT_FOLDERS),
                              save_embedding_layers=False)
        out = {}
        for name, sub in PEFT_FOLDERS.items():
            dst = folder / sub
            if dst.exists():
                shutil.rmtree(dst)
            os.replace(tmp / name, dst)
            out[name] = dst
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
