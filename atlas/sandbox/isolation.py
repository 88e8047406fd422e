"""Choosing and applying process isolation: bubblewrap when it works, rlimits otherwise.

Why: bubblewrap gives a worker a read-only view of the code its task needs and of nothing
else of the host (``view.py``), output trees masked on top, a private ``/tmp``, no network
(empty net namespace) and its own pid namespace, so a candidate can neither change a host
file nor read another run's secret or records even if it escapes the Python guard. Where it
is missing or blocked (containers without user namespaces), we fall back to resource limits
plus the guard, seccomp and Landlock, and say so in the log and in ``Sandbox.isolation``.
This module also holds what every runner gets in either mode: its process state reset, its
limits, and the probe of what its isolation has here.
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

from atlas.sandbox import landlock
from atlas.sandbox.namespaces import (
    RUNNER_UID_BASE,
    RUNNER_UIDS,
    _libc,
    _prctl,
    host_root,
    own_process_tree,
    prepare_runner,
)
from atlas.sandbox.view import CodeView, bind_args, repo_root
from atlas.sandbox.view import secret_folder as secret_folder  # atlas.config imports it here

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




#: what a bubblewrap worker of host root keeps (runners give it all up with their uid):
#: namespaces and mounts, switching each runner to a fresh uid, its working directory's
#: owner, and signals to runners of another uid
ROOT_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL")


def bwrap_args(bwrap: str, tmp_mb: int, hide: list[str] | None = None,
               view: CodeView | None = None, cgroup: str | None = None) -> list[str]:
    """The bwrap prefix for one worker: read-only ``view`` of the code (default: every code
    path) and nothing else of the host, private /tmp, no net, own pids, the ``hide`` paths
    masked last; ``cgroup`` (the worker's directory of runner cgroups) writable.

    Host root runs the worker without a user namespace, keeping ``ROOT_CAPS``, so that each
    runner can switch to a fresh uid that owns nothing: in bubblewrap's user namespace a
    runner would stay kernel uid 0 under another name, the owner of every root file it can
    see. Anyone else gets a user namespace with their own ids (a remapping second one would
    lock the mounts and keep each runner from mounting a /proc of its own)."""
    binds, under_tmp, masks = bind_args(view, hide or [])
    if host_root():
        ids = ["--cap-drop", "ALL", *(a for c in ROOT_CAPS for a in ("--cap-add", c))]
    else:
        ids = ["--unshare-user", "--uid", str(os.getuid()), "--gid", str(os.getgid()),
               "--cap-drop", "ALL"]
    # a cgroup namespace would keep runners from joining cgroups beside the worker's own
    cgroups = ["--bind", cgroup, cgroup] if cgroup else ["--unshare-cgroup-try"]
    return [
        bwrap, *binds, "--dev", "/dev", "--proc", "/proc",
        "--size", str(int(tmp_mb) << 20), "--tmpfs", "/tmp", *under_tmp, *masks,
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", *cgroups, *ids,
        "--die-with-parent", "--new-session", "--as-pid-1",
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
    root = repo_root()
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
        log.info("sandbox isolation: %s (read-only view of the task's code, private /tmp, no "
                 "network, pid namespace) + seccomp + Landlock + guard", BWRAP)
        return BWRAP, ""
    if requested == BWRAP:
        raise RuntimeError(f"sandbox.isolation=bwrap was requested but {reason}. Fix: install "
                           f"bubblewrap (apt-get install bubblewrap) and allow user namespaces, "
                           f"or set sandbox.isolation=auto to fall back to {FALLBACK}")
    log.warning("sandbox isolation: %s + seccomp + Landlock (bubblewrap unusable: %s)",
                FALLBACK, reason)
    return FALLBACK, f"bubblewrap unusable: {reason}"


#: what each part of a runner's isolation holds, and what its absence leaves open
FEATURE_GAPS = {
    "pid": "no pid namespace per runner: a runner sees the host's pids (the filter still "
           "refuses every call on another process)",
    "proc": "no /proc of the runner's own: /proc lists the host's processes, and pids move "
            "with other runners' threads (a low-rate channel)",
    "proc-files": "/proc keeps its directories (fd, task): a lookup there advances the "
                  "machine's pseudo-inode counter, a relay to the next candidate without "
                  "timing (Linux < 5.2 lacks the calls that build the runner's /proc)",
    "readonly": "no read-only view of the host: file access times on the host can carry a "
                "channel between candidates",
    "scratch": "no private scratch: the working directory is swept after each candidate "
               "and its metadata channels are closed by seccomp alone",
    "fresh-uid": "no uid of the runner's own: it runs as your uid, which owns your files "
                 "(the code view and Landlock bound what it reads)",
    "nproc": "no task count of the runner's own (RLIMIT_NPROC): threads are capped by the "
             "watchdog only (1024 per runner, polled every 0.1 s)",
    "landlock": "no Landlock (Linux < 5.13, or disabled): reads are bounded by bubblewrap's "
                "binds and masks, or in the rlimits mode by the runner's uid, and /proc/stat's "
                "fork count is readable",
}
#: where no memory cgroup can be made: what bounds the memory the kernel holds for a runner
MEMORY_GAP = ("no memory cgroup ({why}): memory is counted by the watchdog every 0.1 s "
              "(resident, page tables, the scratch's bytes and inodes), the kernel's share "
              "bounded by the scratch's inode limit, RLIMIT_NOFILE and no pipes; a burst "
              "shorter than a poll can pass the limit")


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
            if host_root():  # each runner switches to a uid of its own
                got.update({"nproc", "fresh-uid"})
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


def isolation_gaps(mode: str, no_cgroup: str | None = None) -> list[str]:
    """What the runner's isolation lacks in ``mode`` here, each with what it leaves open;
    ``no_cgroup``: why no memory cgroup could be made (None: one was)."""
    have = set(runner_features(mode))
    gaps = [why for part, why in FEATURE_GAPS.items() if part not in have]
    return gaps + ([MEMORY_GAP.format(why=no_cgroup)] if no_cgroup is not None else [])


CORES_GAP = ("a core per concurrent runner ({why}): concurrent candidates share cores, so CPU "
             "contention between them is a channel of a few kilobits a second")


def core_sets(workers: int, threads: int) -> tuple[list[tuple[int, ...]] | None, str | None]:
    """Cores of its own for each worker and its runners, so that no two concurrent candidates
    share a core: then one candidate's load cannot slow the other through the scheduler (a
    channel of kilobits a second on a loaded machine, docs/sandbox.md). None and why where the
    cores this process may use are too few; one worker needs none (nothing runs beside it)."""
    cpus = sorted(os.sched_getaffinity(0))
    if workers == 1:
        return None, None
    if workers * threads > len(cpus):
        return None, f"{workers} workers x {threads} threads > {len(cpus)} cores"
    return [tuple(cpus[i * threads:(i + 1) * threads]) for i in range(workers)], None


def runner_identity(mode: str) -> str:
    """Which uid a runner of ``mode`` runs as here, for the isolation line."""
    if "fresh-uid" in runner_features(mode):
        return (f"a fresh uid each (kernel uid {RUNNER_UID_BASE}.."
                f"{RUNNER_UID_BASE + RUNNER_UIDS - 1}, owning nothing)")
    return f"your uid {os.getuid()} (kernel uid; not root)"




def set_process_name(name: str) -> None:
    """Set the process's ``comm`` (what ps and psutil show), for diagnosis only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


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


def _status(key: str) -> int:
    """A number of /proc/self/status (the runner's /proc has no task directory to list)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def vm_data_bytes() -> int:
    """Current private writable virtual memory (what ``RLIMIT_DATA`` counts)."""
    return _status("VmData") * 1024


#: threads (and processes, which seccomp refuses anyway) a candidate may add to its runner
MAX_TASKS = 256
#: descriptors a candidate may hold (soft and hard): each is a kernel object no byte count
#: shows, and the hard limit keeps it from raising the soft one
MAX_FILES = 1024


def task_count() -> int:
    """Threads of this process."""
    return max(_status("Threads"), 1)


def limit_candidate_process(memory_mb: int, cpu_s: float | None, nproc: bool = False) -> None:
    """Rlimits for the process about to run candidate code (irreversible for it).

    ``RLIMIT_DATA`` (not ``RLIMIT_AS``, which breaks JAX/XLA's large virtual reservations)
    allows ``memory_mb`` beyond what the process already holds; the runner's memory cgroup
    or the parent's watchdog enforces the total. ``RLIMIT_FSIZE`` caps any single file
    (SIGXFSZ is ignored so the write fails with an error instead of killing the process);
    ``RLIMIT_NOFILE`` (soft and hard) the descriptors it may hold.
    """
    import signal

    data = vm_data_bytes() + (int(memory_mb) << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    files = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], MAX_FILES)
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if nproc:  # the runner's uid or user namespace is its own: the count is this candidate's
        tasks = task_count() + MAX_TASKS
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    if cpu_s is not None:
        cpu = int(cpu_s) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
