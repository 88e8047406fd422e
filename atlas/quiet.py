"""The library warnings a user cannot act on, filtered one by one by message and module.

Why not all warnings of a library: a new warning may be one the user can act on. Each entry
names the warning's text and the module it is attributed to; ``tests/test_quiet.py`` lists
them. A warning whose call is ours is fixed at the call instead (W&B's "anonymous" notice:
``atlas.loggers.wandb_logger``).
"""

from __future__ import annotations

import warnings

#: (message regex, category, module regex): the module is the one the warning is attributed to
FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    # the KV cache argument of a model's forward, renamed in transformers 5; the decode
    # (atlas/agent/steps.py, atlas/agent/kv_cache.py, atlas/dpo/prefix.py) passes it by its
    # old name until it moves to `cache`. Attributed to torch's Module.__call__, which calls forward
    (r"`past_key_values` is deprecated", FutureWarning, r"torch\.nn\.modules\.module"),
    # read by Lightning/peft when they inspect the model (atlas.dpo.phase reads the new name)
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
)


def install() -> None:
    """Add ``FILTERS`` to the process's warning filters (idempotent)."""
    for message, category, module in FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
