"""Choosing and applying process isolation: bubblewrap when it works, rlimits otherwise.

Why: bubblewrap gives a worker a read-only view of the system and code directories and of
nothing else of the host (no home, no run folder outside the code tree), output trees masked
on top, a private ``/tmp``, no network (empty net namespace), its own pid namespace and no
capabilities, so a candidate can neither change a host file nor read another run's secret or
records even if it escapes the Python guard. Where it is missing
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


#: system directories a worker needs (interpreter, shared libraries, ld.so config, CPU
#: topology); bubblewrap binds these and the code paths, nothing else of the host
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
               "/sys", "/nix")
#: where Hydra puts run and sweep folders (conf/train.yaml), relative to the launch directory
RUN_ROOTS = ("outputs", "multirun")


def _outermost(paths: set[str]) -> list[str]:
    keep = sorted(paths)
    return [p for i, p in enumerate(keep) if not any(p.startswith(q.rstrip("/") + "/")
                                                     for q in keep[:i])]


def code_paths() -> list[str]:
    """Interpreter, venv, atlas and import paths: what a sandboxed Python must read."""
    import atlas

    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.dirname(os.path.abspath(atlas.__file__))),
             *(p for p in sys.path if p)}
    return _outermost({os.path.realpath(p) for p in paths if os.path.isdir(p)})


def readable_roots() -> list[str]:
    """Everything a runner may read besides its own directory: what bubblewrap binds, and
    what Landlock lets it read in every mode."""
    return _outermost({*(d for d in (*SYSTEM_DIRS, "/proc", "/dev") if os.path.isdir(d)),
                       *code_paths()})


def _code_under_tmp() -> list[str]:
    """Code paths below /tmp (e.g. a CI clone there): the private /tmp would hide them, so
    they are bound back in, read-only."""
    return [p for p in code_paths() if p.startswith("/tmp/")]


def hidden_roots(paths: list[str], cwd: str | None = None) -> list[str]:
    """What to mask so that no candidate reads any run's secret or records.

    Each path (a run folder, a secret file) widens to its outermost ancestor that holds no
    code path and is not a top-level directory: the whole output tree, so a sweep's sibling
    jobs (each with a copy of the shared secret and its own ``programs.jsonl``) and the
    sweep's secret go with the job under attack, wherever the tree lies. Hydra's run and
    sweep roots below ``cwd`` are added, so single runs and other sweeps are hidden too.
    """
    needed = [*code_paths(), *SYSTEM_DIRS]
    cwd = os.path.realpath(cwd or os.getcwd())
    out: set[str] = set()
    for p in [*paths, *(os.path.join(cwd, r) for r in RUN_ROOTS)]:
        p = os.path.realpath(p)
        if not os.path.exists(p):
            continue
        while True:
            up = os.path.dirname(p)
            if up == "/" or os.path.dirname(up) == "/" or any(
                    n == up or n.startswith(up + "/") or up.startswith(n + "/") for n in needed):
                break
            p = up
        out.add(p)
    return _outermost(out)


def _hidden(paths: list[str]) -> list[str]:
    """bwrap arguments that mask ``paths`` (output trees, secret files): an empty tmpfs over
    a directory, /dev/null over a file. They come after every other mount, so no later bind
    (the private /tmp, a clone re-bound inside it) uncovers them."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths}):
        if os.path.isdir(p):
            out += ["--tmpfs", p]
        elif os.path.exists(p):
            out += ["--ro-bind", "/dev/null", p]
    return out


def bwrap_args(bwrap: str, tmp_mb: int, hide: list[str] | None = None) -> list[str]:
    """The bwrap prefix for one worker: read-only system and code directories and nothing
    else of the host, private /tmp, no net, own pids, the ``hide`` paths masked last."""
    code = [p for p in code_paths() if not p.startswith("/tmp/")]
    seen = _outermost({*(d for d in SYSTEM_DIRS if os.path.isdir(d)), *code,
                       *_code_under_tmp()})
    binds = [arg for p in seen if not p.startswith("/tmp/") for arg in ("--ro-bind", p, p)]
    rebind = [arg for p in _code_under_tmp() for arg in ("--ro-bind", p, p)]
    # a mask matters only where the sandbox sees the host; elsewhere it would add a path
    hide = [h for h in hide or [] if any(h == p or h.startswith(p + "/") for p in seen)]
    return [
        bwrap, *binds, "--dev", "/dev", "--proc", "/proc",
        "--size", str(int(tmp_mb) << 20), "--tmpfs", "/tmp", *rebind, *_hidden(hide),
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--uid", "65534", "--gid", "65534",
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
        log.info("sandbox isolation: %s (read-only system and code directories, private "
                 "/tmp, no network, pid namespace) + seccomp + Landlock + guard", BWRAP)
        return BWRAP, ""
    if requested == BWRAP:
        raise RuntimeError(f"sandbox.isolation=bwrap was requested but {reason}. Fix: install "
                           f"bubblewrap (apt-get install bubblewrap) and allow user namespaces, "
                           f"or set sandbox.isolation=auto to fall back to {FALLBACK}")
    log.warning("sandbox isolation: %s + seccomp (bubblewrap unusable: %s); candidate file "
                "writes are confined only by the in-process guard and uid nobody", FALLBACK,
                reason)
    return FALLBACK, f"bubblewrap unusable: {reason}"


_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000


def private_scratch(workdir: str, size_mb: int) -> bool:
    """Mount a fresh tmpfs on ``workdir`` that only this process (a runner, right after its
    fork, still single-threaded) sees; False where no mount namespace can be had.

    Why: a directory that is swept after each candidate keeps whatever the sweep does not
    know about (extended attributes, modes, timestamps of the directory itself); a tmpfs in
    the runner's own mount namespace vanishes whole with the runner, so the next candidate
    starts on a filesystem nobody has touched. Root (the rlimits mode in a container) takes
    a mount namespace directly and drops to ``nobody`` later; anyone else takes a user
    namespace too and then gives up every capability in it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.getuid() == 0
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNS if root else _CLONE_NEWNS | _CLONE_NEWUSER) != 0:
        return False
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:  # nothing propagates
        raise OSError(ctypes.get_errno(), "making the runner's mounts private failed")
    options = f"size={int(size_mb)}m,mode=0700".encode()
    if libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", 0, options) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a private tmpfs on {workdir} failed")
    if not root:  # the user namespace's capabilities: gone before any task code runs
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "dropping capabilities failed")
    return True


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
