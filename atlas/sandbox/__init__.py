"""Running untrusted candidate programs outside the main process.

``Sandbox`` (in ``pool.py``, built from the settings in ``settings.py``) keeps warm worker processes (``worker.py``) isolated by
bubblewrap when available (``isolation.py``), each candidate further confined by rlimits,
a seccomp filter (``seccomp.py``) and an in-process guard (``guard.py``); results travel on
a dedicated, nonce-checked pipe protocol (``protocol.py``).
"""

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.guard import SandboxViolation
from atlas.sandbox.pool import Sandbox, SandboxError
from atlas.sandbox.settings import Confinement, Resources, TaskSpec

__all__ = ["CandidateError", "Confinement", "Resources", "Sandbox", "SandboxError",
           "SandboxViolation", "TaskSpec", "load_candidate"]
