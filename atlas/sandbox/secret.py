"""The per-run task secret: where hidden randomness (environment seeds, validation points) comes from.

Why: the code and ``task.env_seeds`` are public, so environments derived from them alone can be
rebuilt by a candidate that then plays the oracle. The secret lives in the run folder (so a
resumed or repeated run faces the same environments) and only trusted scorer processes
receive it; candidate runner processes are forked from a zygote that never held it.
"""

from __future__ import annotations

import os
import secrets
from hashlib import blake2b, sha256
from pathlib import Path

SECRET_FILE = ".task_secret"


def is_secret(value: object) -> bool:
    """Whether ``value`` is a task secret: 64 lowercase hex characters (32 random bytes,
    ``secrets.token_hex(32)``), the key ``derive_seed`` hashes with."""
    return (isinstance(value, str) and len(value) == 64
            and all(c in "0123456789abcdef" for c in value))


def check_secret(value: object, field: str) -> None:
    """A ValueError naming ``field`` and the fix unless ``value`` is hexadecimal, what
    ``derive_seed`` keys its hash with (a run's own secret: 64 hex characters)."""
    try:
        ok = isinstance(value, str) and bool(value) and bool(bytes.fromhex(value))
    except ValueError:
        ok = False
    if not ok:
        shown = repr(value)[:20] + ("..." if len(repr(value)) > 20 else "")
        raise ValueError(f"{field}: {shown} is not a task secret; use hex digits, e.g. "
                         f"secrets.token_hex(32) (64 characters, as in a run folder)")


def _read(path: Path, fix: str) -> str:
    value = path.read_text().strip()
    if is_secret(value):
        return value
    raise ValueError(f"{path} is not a task secret (expected 64 hex characters); {fix}")


def fingerprint(value: str) -> str:
    """The first 16 hex digits of the secret's SHA-256: what a run records so that reports can
    tell whether two runs faced one secret (``atlas.pairing``) without publishing it."""
    return sha256(value.strip().encode()).hexdigest()[:16]


def missing_secret_message(source: str | os.PathLike[str]) -> str:
    """Why a missing ``sandbox.secret_file`` is refused, and the fix (one line)."""
    return (f"sandbox.secret_file={str(source)!r} does not exist: a mistyped path would give "
            f"this run a fresh secret, and scores not comparable with the runs it was meant to "
            f"match; fix the path, or set sandbox.create_secret=true to create a new shared "
            f"secret there")


def run_secret(run_dir: str | os.PathLike[str], source: str | None = None, *,
               create: bool = False) -> str:
    """The run's secret (64 hex chars), created with mode 0600 on first use.

    ``source`` (``sandbox.secret_file``) seeds a new run folder with a shared secret, so runs
    whose scores are compared (methods, a resumed run and an uninterrupted one) face the same
    hidden environments; otherwise a fresh random secret is drawn. A ``source`` that does
    not exist is created only with ``create`` (``sandbox.create_secret``, and a sweep's own
    secret); else ``FileNotFoundError``: a typo in the path must not start a new secret.
    """
    path = Path(run_dir) / SECRET_FILE
    if path.exists():
        return _read(path, "delete it to start a new run with new hidden environments")
    if source:
        src = Path(source).expanduser()
        if not src.exists():
            if not create:
                raise FileNotFoundError(missing_secret_message(source))
            create_secret_file(src)
        value = _read(src, "fix sandbox.secret_file or point it to a new path")
    else:
        value = secrets.token_hex(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


def create_secret_file(path: Path) -> None:
    """Create a shared secret file atomically: the jobs of a sweep (SLURM: at once) may race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, path)  # atomic, and fails if another job created it first
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def sweep_secret_file() -> str | None:
    """``<sweep dir>/.task_secret`` when running under a Hydra multirun, else None.

    Why: the runs of one sweep are compared with each other (methods on the same seeds), so
    by default they share one secret and face the same hidden environments; a single run
    draws its own.
    """
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):  # not under Hydra (tests call run() directly)
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    return str(Path(hc.sweep.dir).resolve() / SECRET_FILE)


def derive_seed(secret: str, *parts: object) -> int:
    """A 63-bit seed from the secret and public labels (one-way: the labels reveal nothing)."""
    h = blake2b(key=bytes.fromhex(secret)[:64], digest_size=8)
    h.update(repr(parts).encode("utf-8"))
    return int.from_bytes(h.digest(), "big") >> 1
