"""Choosing and applying process isolation: bubblewrap when it works, rlimits otherwise.

Why: bubblewrap gives a worker a read-only view of the whole filesystem with a private
``/tmp``, no network (empty net namespace), its own pid namespace and no capabilities, so a
candidate cannot change a host file even if it escapes the Python guard. Where it is missing
or blocked (containers without user namespaces), we fall back to resource limits plus the
guard and seccomp, and say so in the log and in ``Sandbox.isolation``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import resource
import shutil
import subprocess
import sys

log = logging.getLogger("atlas.sandbox")

BWRAP_PATHS = ("/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap")
ISOLATION_CHOICES = ("auto", "bwrap", "rlimits")
BWRAP, FALLBACK = "bwrap", "rlimits+guard"
#: a single file a candidate writes (and its captured output) may not exceed this
MAX_FILE_BYTES = 256 << 20

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def find_bwrap() -> str | None:
    """Path of the bubblewrap binary, if installed."""
    for path in BWRAP_PATHS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("bwrap")


def _code_under_tmp() -> list[str]:
    """Interpreter, venv and import paths that live below /tmp (e.g. a CI clone there):
    the private /tmp would hide them, so they are bound back in, read-only."""
    import atlas

    paths = {sys.prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(atlas.__file__)),
             *(p for p in sys.path if p)}
    keep = sorted(os.path.realpath(p) for p in paths)
    keep = [p for p in keep if p.startswith("/tmp/") and os.path.isdir(p)]
    return [p for i, p in enumerate(keep) if not any(p.startswith(q + "/") for q in keep[:i])]


def _hidden(paths: list[str]) -> list[str]:
    """bwrap arguments that mask ``paths`` (the run folder, the secret file): an empty tmpfs
    over a directory, /dev/null over a file."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths}):
        if os.path.isdir(p):
            out += ["--tmpfs", p]
        elif os.path.exists(p):
            out += ["--ro-bind", "/dev/null", p]
    return out


def bwrap_args(bwrap: str, tmp_mb: int, hide: list[str] | None = None) -> list[str]:
    """The bwrap prefix for one worker: read-only root, private /tmp, no net, own pids."""
    rebind = [arg for p in _code_under_tmp() for arg in ("--ro-bind", p, p)]
    return [
        bwrap, "--ro-bind", "/", "/", *_hidden(hide or []), "--dev", "/dev", "--proc", "/proc",
        "--size", str(int(tmp_mb) << 20), "--tmpfs", "/tmp", *rebind,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--uid", "65534", "--gid", "65534", "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--as-pid-1",
        "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp", "--",
    ]


def python_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a sandboxed Python: ``PYTHONPATH`` made absolute, atlas importable.

    Why: sandboxed processes start in another directory (bwrap's ``--chdir /tmp``), so a
    relative ``PYTHONPATH=.`` would point nowhere and the worker could not import atlas.
    """
    import atlas

    env = dict(os.environ if base is None else base)
    root = os.path.dirname(os.path.dirname(os.path.abspath(atlas.__file__)))
    parts = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([root, *parts]))
    return env


@functools.lru_cache(maxsize=1)
def probe_bwrap() -> tuple[bool, str]:
    """Run a trivial Python in bwrap once per process: (works, reason if not)."""
    bwrap = find_bwrap()
    if bwrap is None:
        return False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        proc = subprocess.run(bwrap_args(bwrap, 16) + ["/bin/true"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        return False, (f"bubblewrap cannot create its sandbox here (exit {proc.returncode}: "
                       f"{proc.stderr.strip()[:300]}); user namespaces may be disabled")
    cmd = bwrap_args(bwrap, 16) + [sys.executable, "-c", "import atlas.sandbox.protocol"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=python_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"Python inside bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        return False, (f"bubblewrap works but Python inside it cannot import atlas (exit "
                       f"{proc.returncode}: {proc.stderr.strip()[-300:]})")
    return True, ""


def resolve_isolation(requested: str) -> tuple[str, str]:
    """Map ``sandbox.isolation=auto|bwrap|rlimits`` to (mode really active, why if degraded)."""
    if requested not in ISOLATION_CHOICES:
        raise ValueError(f"sandbox.isolation={requested!r} is invalid: use one of "
                         f"{ISOLATION_CHOICES}")
    if requested == "rlimits":
        log.info("sandbox isolation: %s (requested by sandbox.isolation=rlimits)", FALLBACK)
        return FALLBACK, "sandbox.isolation=rlimits was requested"
    ok, reason = probe_bwrap()
    if ok:
        log.info("sandbox isolation: %s (read-only root, private /tmp, no network, pid "
                 "namespace) + seccomp + guard", BWRAP)
        return BWRAP, ""
    if requested == BWRAP:
        raise RuntimeError(f"sandbox.isolation=bwrap was requested but {reason}. Fix: install "
                           f"bubblewrap (apt-get install bubblewrap) and allow user namespaces, "
                           f"or set sandbox.isolation=auto to fall back to {FALLBACK}")
    log.warning("sandbox isolation: %s + seccomp (bubblewrap unusable: %s); candidate file "
                "writes are confined only by the in-process guard and uid nobody", FALLBACK,
                reason)
    return FALLBACK, f"bubblewrap unusable: {reason}"


def set_process_name(name: str) -> None:
    """Set the process's ``comm`` (what ps and psutil show), for diagnosis only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def harden_worker() -> None:
    """Worker start-up: die with the parent, reap orphans, no core dumps, not ptrace-able."""
    import signal

    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # bwrap adds --die-with-parent on top
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def vm_data_bytes() -> int:
    """Current private writable virtual memory (what ``RLIMIT_DATA`` counts)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_candidate_process(memory_mb: int, cpu_s: float | None) -> None:
    """Rlimits for the process about to run candidate code (irreversible for it).

    ``RLIMIT_DATA`` (not ``RLIMIT_AS``, which breaks JAX/XLA's large virtual reservations)
    allows ``memory_mb`` beyond what the process already holds; the parent's RSS watchdog
    enforces the total. ``RLIMIT_FSIZE`` caps any single file (SIGXFSZ is ignored so the
    write fails with an error instead of killing the process).
    """
    import signal

    data = vm_data_bytes() + (int(memory_mb) << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if cpu_s is not None:
        cpu = int(cpu_s) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
