"""Running untrusted candidate programs outside the main process.

``Sandbox`` (in ``pool.py``) keeps warm worker processes (``worker.py``) isolated by
bubblewrap when available (``isolation.py``), each candidate further confined by rlimits,
a seccomp filter (``seccomp.py``) and an in-process guard (``guard.py``); results travel on
a dedicated, nonce-checked pipe protocol (``protocol.py``).
"""

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.guard import SandboxViolation
from atlas.sandbox.pool import Sandbox, SandboxError

__all__ = ["CandidateError", "Sandbox", "SandboxError", "SandboxViolation", "load_candidate"]
