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
import struct
import subprocess
import sys

import atlas
from atlas.sandbox import landlock

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


#: top-level modules the sandbox's processes import (the task's factories), registered by
#: each ``Sandbox``: the launch directory is bound only when one of them lives there
_NEEDED_MODULES: set[str] = set()


def need_modules(*paths: str) -> None:
    """Register the modules of ``"module:function"`` factories a sandbox imports."""
    _NEEDED_MODULES.update(p.split(":")[0].split(".")[0] for p in paths if p)


def _holds_needed_module(directory: str) -> bool:
    import importlib.util

    for name in _NEEDED_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec and spec.origin not in (None, "namespace") else None
        where = origin or next(iter(getattr(spec, "submodule_search_locations", None) or []),
                               None)
        if where and os.path.realpath(where).startswith(directory + os.sep):
            return True
    return False


def repo_root() -> str:
    """The directory holding the ``atlas`` package (a clone's root, or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(atlas.__file__)))


def code_paths() -> list[str]:
    """Interpreter, venv, atlas and import paths: what a sandboxed Python must read. The
    launch directory (which ``python -m`` puts on ``sys.path``) only where a task's module
    lives there: a candidate sees only the code it must import."""
    cwd = os.path.realpath(os.getcwd())
    imports = {os.path.realpath(p) for p in sys.path if p}
    if cwd in imports and cwd != repo_root() and not _holds_needed_module(cwd):
        imports.discard(cwd)
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), repo_root(), *imports}
    return _outermost({os.path.realpath(p) for p in paths if os.path.isdir(p)})


#: folders a secret file may not lie in directly (masking its folder whole would hide the
#: system): a system directory or anything below one
_SYSTEM_ROOTS = (*SYSTEM_DIRS, "/proc", "/dev", "/boot", "/run", "/var/lib", "/var/cache")


def secret_folder(path: str, field: str = "sandbox.secret_file") -> str:
    """The folder to mask for a secret file: its own folder, whole (a secret beside it, of
    another comparison, goes with it). A ValueError with the fix where that folder holds
    code candidates import (a package, atlas's ``conf/``, an import root) or is a system
    folder: masking it would break the sandbox, not masking it would leave the secret
    readable by name."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    why = None
    if folder == "/" or any(folder == d or folder.startswith(d + "/") for d in _SYSTEM_ROOTS):
        why = "a system folder"
    elif any(c == folder or c.startswith(folder + "/") for c in code_paths()):
        why = "a folder that holds code candidates import"
    elif os.path.exists(os.path.join(folder, "__init__.py")) or any(
            n.endswith(".py") for n in _listdir(folder)):
        why = "a Python package folder"
    elif folder == os.path.join(repo_root(), "conf") or folder.startswith(
            os.path.join(repo_root(), "conf") + "/"):
        why = "atlas's config folder conf/"
    if why:
        raise ValueError(f"{field}={path} lies directly in {why} ({folder}); the sandbox masks "
                         f"a secret's folder whole, so keep it in a folder of its own or a run "
                         f"folder (outputs/, multirun/), e.g. outputs/shared/.task_secret")
    return folder


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def readable_roots() -> list[str]:
    """Everything a runner may read besides its own directory: what bubblewrap binds, and
    what Landlock lets it read in every mode."""
    return _outermost({*(d for d in (*SYSTEM_DIRS, "/proc", "/dev") if os.path.isdir(d)),
                       *code_paths()})


#: what a candidate may read of /proc and /sys besides its own process: what libraries ask
#: about the machine (CPU count and features, memory size). Not the rest: global counters
#: (/proc/stat's count of forks since boot, a cgroup's task count) are channels between
#: candidates, as pids were
MACHINE_INFO = ("/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu")


def candidate_readable(readable: list[str] | tuple[str, ...]) -> list[str]:
    """``readable`` with /proc and /sys narrowed to this process and ``MACHINE_INFO`` (for the
    runner's Landlock rules, called in the runner: /proc/self is its own pid there)."""
    out = [r for r in readable if r not in ("/proc", "/sys")]
    return out + [os.path.realpath("/proc/self"), *MACHINE_INFO]


def _code_under_tmp() -> list[str]:
    """Code paths below /tmp (e.g. a CI clone there): the private /tmp would hide them, so
    they are bound back in, read-only."""
    return [p for p in code_paths() if p.startswith("/tmp/")]


def hidden_roots(paths: list[str], cwd: str | None = None) -> list[str]:
    """What to mask so that no candidate reads any run's secret or records.

    A secret file stands for its folder, whole (``secret_folder``, which refuses a folder of
    code or of the system). Each path (a run folder, a secret's folder) widens to its
    outermost ancestor that holds no code path and is not a top-level directory: the whole
    output tree, so a sweep's sibling jobs (each with a copy of the shared secret and its
    own ``programs.jsonl``) and the sweep's secret go with the job under attack, wherever
    the tree lies. Hydra's run and sweep roots below ``cwd`` and below the clone holding
    atlas are added, so single runs and other sweeps are hidden too, from any launch
    directory (``atlas.score`` masks what a run masks).
    """
    needed = [*code_paths(), *SYSTEM_DIRS]
    cwd = os.path.realpath(cwd or os.getcwd())
    roots = [os.path.join(base, r) for base in dict.fromkeys([cwd, repo_root()])
             for r in RUN_ROOTS]
    out: set[str] = set()
    for p in [*paths, *roots]:
        p = os.path.realpath(p)
        if not os.path.exists(p):
            continue
        if not os.path.isdir(p):
            p = secret_folder(p)
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
    # root: bubblewrap sets up the mounts before the user namespace, so a runner could not
    # take one of its own and mount /proc in it; CAP_SYS_ADMIN in bubblewrap's namespace lets
    # it take the mount and pid namespaces directly (the runner drops it before the program)
    root_caps = ["--cap-add", "CAP_SYS_ADMIN"] if os.getuid() == 0 else []
    return [
        bwrap, *binds, "--dev", "/dev", "--proc", "/proc",
        "--size", str(int(tmp_mb) << 20), "--tmpfs", "/tmp", *rebind, *_hidden(hide),
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        # the caller's own ids: a second, remapping user namespace would lock the mounts and
        # keep each runner from mounting a /proc of its own pid namespace
        "--unshare-cgroup-try", "--uid", str(os.getuid()), "--gid", str(os.getgid()),
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", *root_caps,
        "--as-pid-1",
        "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp", "--",
    ]


#: the only variables of the user's environment a sandboxed process inherits: locale, time
#: zone, search path, thread counts and the JAX platform. Nothing that can hold a credential
#: (API keys, tokens, cloud profiles) is on it; HOME and TMPDIR point into the scratch.
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "JAX_PLATFORMS", "XLA_FLAGS",
            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
            "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
ENV_KEEP_PREFIXES = ("LC_",)


def sandbox_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a scorer worker (and so of its zygote and runners): the
    allow-list ``ENV_KEEP`` of the user's environment, ``extra`` on top, ``PYTHONPATH`` made
    absolute. Why an allow-list: the user's shell holds credentials (``OPENAI_API_KEY``,
    ``HF_TOKEN``, ``WANDB_API_KEY``...) that a candidate could read and print into a record."""
    env = {k: v for k, v in os.environ.items()
           if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    env.update(HOME="/tmp", TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1", **(extra or {}))
    return python_env(env)


def python_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a sandboxed Python: ``PYTHONPATH`` made absolute, atlas importable.

    Why: sandboxed processes start in another directory (bwrap's ``--chdir /tmp``), so a
    relative ``PYTHONPATH=.`` would point nowhere and the worker could not import atlas.
    """
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
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                              env=sandbox_env())
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


#: what each part of a runner's isolation holds, and what its absence leaves open
FEATURE_GAPS = {
    "pid": "no pid namespace per runner: a runner sees the host's pids (the filter still "
           "refuses every call on another process)",
    "proc": "no /proc of the runner's own: /proc lists the host's processes, and pids move "
            "with other runners' threads (a low-rate channel)",
    "readonly": "no read-only view of the host: file access times on the host can carry a "
                "channel between candidates",
    "scratch": "no private scratch: the working directory is swept after each candidate "
               "and its metadata channels are closed by seccomp alone",
    "nproc": "no task count of the runner's own (RLIMIT_NPROC): threads are capped by the "
             "watchdog only (1024 per runner, polled every 0.1 s)",
    "landlock": "no Landlock (Linux < 5.13, or disabled): reads are bounded by bubblewrap's "
                "binds and masks, or in the rlimits mode by the runner's uid, and /proc/stat's "
                "fork count is readable",
}
#: what no mode here has: memory is counted by polling, not by the kernel
MEMORY_GAP = ("memory (resident + scratch tmpfs) is counted by the watchdog every 0.1 s, not "
              "by a cgroup: a burst shorter than that can pass the limit")


def _features_here(workdir: str) -> list[str]:
    """What a runner forked from this process gets (``own_process_tree`` + ``prepare_runner``
    in a throw-away child), as a sorted list."""
    import json

    r, w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(out_r)
            got = own_process_tree(w)
            got = prepare_runner(workdir, 16, got)
            if host_root():
                got.add("nproc")  # each runner switches to a uid of its own
            if landlock.abi_version() >= 1:
                got.add("landlock")
            os.write(out_w, json.dumps(sorted(got)).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(out_w)
    os.read(r, 32)
    os.close(r)
    with os.fdopen(out_r, "rb") as fh:
        data = fh.read()
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return sorted(json.loads(data)) if data else []


def probe_features_main() -> None:
    """Print ``_features_here`` as JSON (run inside bubblewrap by ``runner_features``)."""
    import json
    import tempfile

    workdir = tempfile.mkdtemp()
    try:
        print(json.dumps(_features_here(workdir)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=2)
def runner_features(mode: str) -> tuple[str, ...]:
    """The isolation parts a runner gets in ``mode`` here (see ``FEATURE_GAPS``), probed in
    a fresh Python (never a fork of this process, which may hold threads and a model)."""
    import json

    code = "from atlas.sandbox.isolation import probe_features_main; probe_features_main()"
    cmd = [sys.executable, "-c", code]
    if mode == BWRAP:
        bwrap = find_bwrap()
        if bwrap is None:
            return ()
        cmd = bwrap_args(bwrap, 64) + cmd
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                              env=sandbox_env())
        return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return ()


def isolation_gaps(mode: str) -> list[str]:
    """What the runner's isolation lacks in ``mode`` here, each with what it leaves open."""
    have = set(runner_features(mode))
    return [why for part, why in FEATURE_GAPS.items() if part not in have] + [MEMORY_GAP]


_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, 0x8000, 0x1
#: the source name of a runner's scratch tmpfs, how the watchdog finds it to count its bytes
SCRATCH_SOURCE = "atlas-scratch"


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _map_own_ids(uid: int, gid: int) -> None:
    """Map the caller's ids into the user namespace it just took. The worker is not dumpable
    (``harden_worker``), which would leave /proc/self's files to another owner; the runner
    is dumpable while it writes its maps, with no other process in its pid namespace."""
    _prctl(_PR_SET_DUMPABLE, 1)
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    finally:
        _prctl(_PR_SET_DUMPABLE, 0)


def own_process_tree(report_fd: int) -> set[str]:
    """Give the calling process (a runner just forked by the zygote, single-threaded) a pid
    namespace of its own and a mount namespace, and continue as pid 1 of that namespace.

    Why: a candidate must not be able to name any other process, so it can neither signal
    nor re-limit, re-nice, re-pin or re-schedule the zygote, the scorer or another runner
    (every later runner would inherit the change), nor learn from its pid how many threads
    the runner before it started. The process that unshared forks the runner, writes the
    runner's pid (as the zygote sees it) to ``report_fd`` and exits, so the runner is
    reparented to the zygote (a subreaper) and everything in the namespace dies with it.
    Root (or a bubblewrap worker holding CAP_SYS_ADMIN) takes the namespaces directly;
    anyone else takes a user namespace too. Only the runner returns, with what it got
    (``"pid"``, ``"mount"``, ``"user"``); an empty set where no namespace can be had (then
    it is the runner itself, with its own pid written).
    """
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    got: set[str] = set()
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID) == 0:
        got = {"pid", "mount"}
    elif libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWUSER) == 0:
        _map_own_ids(uid, gid)
        got = {"pid", "mount", "user"}
    if "pid" in got:
        pid = os.fork()
        if pid:  # the intermediate: report, and leave the runner to the zygote
            os.write(report_fd, str(pid).encode())
            os._exit(0)
    else:
        os.write(report_fd, str(os.getpid()).encode())
    os.close(report_fd)
    return got


def prepare_runner(workdir: str, size_mb: int, got: set[str]) -> set[str]:
    """In the runner, right after ``own_process_tree``: its own session, a read-only view of
    the host, a fresh tmpfs on ``workdir`` and a /proc of its own pid namespace; then (not
    root on the host) a user namespace of its own and no capability. Returns ``got`` plus
    what was set up (``"readonly"``, ``"scratch"``, ``"proc"``, ``"nproc"``).

    Why each: the session makes ``kill(0)`` reach nobody else; read-only mounts stop file
    access times on the host (a channel) from moving; the tmpfs vanishes whole with the
    runner, with anything written there and its modes, timestamps and extended attributes;
    the new /proc shows this runner alone; the per-runner user namespace makes
    ``RLIMIT_NPROC`` count this candidate's threads only.
    """
    libc = _libc()
    got = set(got)
    os.setsid()
    if "mount" in got:
        if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "making the runner's mounts private failed")
        attr = ctypes.create_string_buffer(struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0))
        if libc.syscall(_MOUNT_SETATTR, -100, b"/", _AT_RECURSIVE, attr,
                        ctypes.c_size_t(32)) == 0:
            got.add("readonly")
        options = f"size={int(size_mb)}m,mode=0700".encode()
        if libc.mount(SCRATCH_SOURCE.encode(), workdir.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      options) != 0:
            raise OSError(ctypes.get_errno(), f"mounting a private tmpfs on {workdir} failed")
        got.add("scratch")
        if "pid" in got and libc.mount(b"proc", b"/proc", b"proc",
                                       _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) == 0:
            got.add("proc")
    if os.getuid() == 0 and "user" not in got and not host_root():
        # root of a bubblewrap worker: the late user namespace (after the mounts, which it
        # would have locked) separates this runner's task count from every other's. Its ids
        # stay unmapped (mapping root needs CAP_SETFCAP): the runner is the overflow uid
        # there, and its files, on a tmpfs of the worker's namespace, are still its own.
        if libc.unshare(_CLONE_NEWUSER) == 0:
            got.add("user")
    if "user" in got:
        got.add("nproc")
    if not host_root():  # host root gives up its capabilities with its uid (``drop_root``)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "dropping capabilities failed")
    return got


@functools.lru_cache(maxsize=1)
def host_root() -> bool:
    """Whether this process is root of the host (not root of a user namespace): then it may
    switch each runner to a uid of its own."""
    if os.getuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return False


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


_RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_WHO_PROCESS = 1


def _ioprio(value: int | None = None) -> int:
    import platform

    nr = (_IOPRIO_GET if value is None else _IOPRIO_SET).get(platform.machine())
    if nr is None:
        return -1
    if value is None:
        return int(_libc().syscall(nr, _IOPRIO_WHO_PROCESS, 0))
    return int(_libc().syscall(nr, _IOPRIO_WHO_PROCESS, 0, value))


def process_state() -> dict[str, object]:
    """What a process passes on to the processes it forks and a candidate could want to
    change for the next one: every rlimit, the nice value, CPU affinity, scheduling policy
    and priority, and I/O priority (the zygote records it before any runner exists)."""
    return {"rlimits": {r: resource.getrlimit(r) for r in _RLIMITS},
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "affinity": sorted(os.sched_getaffinity(0)),
            "sched": (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority),
            "ioprio": _ioprio()}


def reset_process_state(state: dict[str, object]) -> None:
    """Put this process back into ``state`` (``process_state`` of the zygote before any
    runner), so every runner starts alike whatever ran before it; best effort where a limit
    can no longer be raised (then it was never lowered: no runner reaches the zygote)."""
    for r, limits in state["rlimits"].items():  # type: ignore[union-attr]
        try:
            if resource.getrlimit(r) != tuple(limits):
                resource.setrlimit(r, tuple(limits))
        except (OSError, ValueError):
            pass
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != state["nice"]:
            os.setpriority(os.PRIO_PROCESS, 0, int(state["nice"]))  # type: ignore[arg-type]
        os.sched_setaffinity(0, state["affinity"])  # type: ignore[arg-type]
        policy, prio = state["sched"]  # type: ignore[misc]
        if (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) != (policy, prio):
            os.sched_setscheduler(0, policy, os.sched_param(prio))
        if int(state["ioprio"]) >= 0 and _ioprio() != state["ioprio"]:  # type: ignore[arg-type]
            _ioprio(int(state["ioprio"]))  # type: ignore[arg-type]
    except OSError:
        pass


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


#: threads (and processes, which seccomp refuses anyway) a candidate may add to its runner
MAX_TASKS = 256


def task_count() -> int:
    """Threads of this process."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def limit_candidate_process(memory_mb: int, cpu_s: float | None, nproc: bool = False) -> None:
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
    if nproc:  # the runner's uid or user namespace is its own: the count is this candidate's
        tasks = task_count() + MAX_TASKS
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    if cpu_s is not None:
        cpu = int(cpu_s) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
