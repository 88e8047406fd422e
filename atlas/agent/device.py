"""The run's device (``device=auto|cpu|cuda``): resolved and checked in one place."""

from __future__ import annotations

from atlas.schema import ConfigError


def resolve_device(device: str) -> str:
    """The torch device string to run on: ``auto`` is CUDA when torch sees a GPU, else the
    CPU; a CUDA device needs a GPU torch can see (``ConfigError`` naming the fix).

    ``atlas.train`` calls it right after validation, before anything is built, so torch is
    imported here on first use (validation itself imports no torch).
    """
    import torch  # deferred: a heavy import the config checks before this one do without

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as err:
        raise ValueError(f"device={device!r} is not a torch device; use auto, cpu or cuda") from err
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device} but torch sees no GPU (torch.cuda.is_available() is "
                          "false); use device=cpu or device=auto, or install a CUDA build of "
                          "torch on a machine with a GPU")
    return device
