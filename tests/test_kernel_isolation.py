"""Issue 48: what the kernel sees of a runner, in both modes.

A runner is never kernel uid 0 and is capped by ``RLIMIT_NPROC``; memory the kernel holds
for it counts (a memory cgroup where one can be made, the scratch's inode limit, page tables
and no pipes elsewhere); it reads only the code its task needs and a few devices; it can
neither read nor move the machine's pseudo-inode counter; and an interpreter in a private
folder imports every module. Run as root these tests cover the root rows of
docs/sandbox.md's environment table; run as an ordinary user, the others.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec, cgroup, isolation
from atlas.sandbox.isolation import probe_bwrap
from atlas.sandbox.namespaces import INODE_BYTES, PROC_FILES, SCRATCH_INODES
from atlas.sandbox.runner import RUNNER_UID_BASE, RUNNER_UIDS
from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER
from atlas.sandbox.view import code_view
from atlas.types import FailureKind

REPO = Path(__file__).resolve().parents[1]
MODES = ["rlimits", pytest.param("bwrap", marks=pytest.mark.skipif(
    not probe_bwrap()[0], reason="bubblewrap unusable here"))]
ROOT = os.getuid() == 0


@pytest.fixture(params=["cgroup", "watchdog"])
def memory_bound(request, monkeypatch):
    """Both ways memory is bounded: a memory cgroup per runner (where one can be made here),
    and without one (the watchdog, the scratch's inode limit, no pipes), as where none can."""
    if request.param == "watchdog":
        monkeypatch.setattr(cgroup, "make_base", lambda slots: (None, "not made, for the test"))
    else:
        base, why = cgroup.make_base(1)
        if base is None:
            pytest.skip(f"no memory cgroup can be made here: {why}")
        cgroup.remove_tree(base.path)
    return request.param


def _toy(mode: str, *, timeout_s: float = 30.0, **resources: int) -> Sandbox:
    return Sandbox(TaskSpec(TOY_SCORER, {"steps": 3}, TOY_RUNNER, timeout_s=timeout_s),
                   resources=Resources(**resources),
                   confinement=Confinement(isolation=mode, score_once=False))


def _report(ev) -> dict:
    """The JSON a probe program printed (the failure message carries its output)."""
    line = next((x for x in ev.message.splitlines() if "REPORT " in x), None)
    assert line is not None, ev
    return json.loads(line.split("REPORT ", 1)[1])


@pytest.mark.parametrize("mode", MODES)
def test_a_runner_is_never_kernel_root_and_the_isolation_line_says_which_uid(mode):
    """Seen from the host while its candidate runs, every process of a runner has a uid that
    is not 0 (as root: a fresh one of the runner's own, which owns nothing; else the user's),
    in bubblewrap too, where it used to be kernel uid 0 under another name. (A runner drops
    root right after its namespaces and mounts, before the task's code.)"""
    code = ("import time\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n        time.sleep(1.5)\n    return 0\n")
    with _toy(mode, workers=1, timeout_s=20) as sb:
        assert sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {}).passed
        future = sb.submit(code, {})
        time.sleep(0.3)  # the runner is past its set-up (as root) and runs the candidate
        uids: set[int] = set()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for p in sb._all[0]._candidate_procs():
                try:
                    uids.update(p.uids())
                except psutil.Error:
                    pass
            time.sleep(0.05)
        assert future.result().passed
        line = sb.isolation_line
    assert uids and 0 not in uids, uids
    if ROOT:
        assert all(RUNNER_UID_BASE <= u < RUNNER_UID_BASE + RUNNER_UIDS for u in uids), uids
        assert f"kernel uid {RUNNER_UID_BASE}" in line and "owning nothing" in line, line
    else:
        assert uids == {os.getuid()}, uids
        assert f"your uid {os.getuid()}" in line, line
    assert "memory:" in line, line


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


@pytest.mark.skipif(not ROOT, reason="an ordinary user's scorer holds no capability anyway")
@pytest.mark.parametrize("mode", MODES)
def test_a_root_scorer_keeps_only_the_capabilities_it_needs(mode):
    """Once its zygote is forked, the scorer (which compiles code derived from candidates)
    holds CAP_KILL and, in the rlimits mode, CAP_DAC_OVERRIDE and CAP_FOWNER, nothing else,
    and has no_new_privs, so nothing it runs as uid 0 gets the rest back. Its zygote keeps
    what making a runner needs (CAP_SYS_ADMIN, CAP_SETUID)."""
    with _toy(mode, workers=1, timeout_s=20) as sb:
        assert sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {}).passed
        scorer = sb._all[0].worker
        zygote = next(p for p in scorer.children() if p.name() == "atlas-zygote")
        mine, its = _status(scorer.pid), _status(zygote.pid)
    kept = (1 << 5) | ((1 << 1) | (1 << 3) if mode == "rlimits" else 0)
    assert int(mine["CapEff"], 16) == int(mine["CapPrm"], 16) == kept, mine
    assert int(mine["CapInh"], 16) == 0 and mine["NoNewPrivs"].strip() == "1", mine
    assert int(its["CapEff"], 16) & (1 << 21 | 1 << 7) == 1 << 21 | 1 << 7, its


@pytest.mark.parametrize("mode", MODES)
def test_threads_are_capped_by_rlimit_nproc_in_every_mode(mode):
    """A candidate can add at most ``isolation.MAX_TASKS`` threads (the kernel refuses the
    next), bubblewrap as root included, where only the watchdog's 1024 used to hold."""
    code = ("import sys\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n        th, tm = sys.modules['threading'], sys.modules['time']\n"
            "        n = 0\n        try:\n            for _ in range(2000):\n"
            "                th.Thread(target=tm.sleep, args=(5,), daemon=True).start()\n"
            "                n += 1\n        except RuntimeError:\n            pass\n"
            "        raise ValueError(n)\n    return 0\n")
    with _toy(mode, workers=1, timeout_s=30) as sb:
        ev = sb.evaluate(code, {})
    started = int(ev.message.rsplit(": ", 1)[1].split()[0])
    assert isolation.MAX_TASKS - 8 <= started <= isolation.MAX_TASKS, ev.message


PAGE_TABLES = '''import sys


def policy(contexts, history, t, state):
    if t == 0:
        ct = sys.modules["ctypes"]
        libc = ct.CDLL(None)
        libc.mmap.restype = ct.c_void_p
        size = 400 << 30  # read-only and sparse: no RLIMIT_DATA, no resident page
        addr = libc.mmap(None, ct.c_size_t(size), 1, 0x22 | 0x4000, -1, 0)
        for off in range(0, size, 2 << 20):  # a page table (4 KB) per 2 MB read
            ct.c_char.from_address(addr + off).value
        sys.modules["time"].sleep(2)
    return 0
'''


@pytest.mark.parametrize("mode", MODES)
def test_page_tables_count_against_the_memory_limit(mode, memory_bound):
    """800 MB of page tables (a 400 GB read-only mapping read every 2 MB: no resident page,
    nothing ``RLIMIT_DATA`` counts) under a 256 MB limit: killed, by the memory cgroup or by
    the watchdog, which adds each runner's page tables."""
    with _toy(mode, workers=1, memory_mb=256, timeout_s=60) as sb:
        ev = sb.evaluate(PAGE_TABLES, {})
        honest = sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {})
    assert ev.failure_kind == FailureKind.KILLED.value and "memory limit" in ev.message, ev
    assert honest.passed


KERNEL_OBJECTS = '''import json
import os
import sys


def policy(contexts, history, t, state):
    if t == 0:
        out = {}
        n = 0
        try:
            while n < 100000:
                os.mkdir(f"d{n}")
                n += 1
        except OSError as exc:
            out["mkdir_error"] = exc.errno
        out["dirs"] = n
        res = sys.modules["resource"]
        out["nofile"] = list(res.getrlimit(res.RLIMIT_NOFILE))
        try:
            res.setrlimit(res.RLIMIT_NOFILE, (out["nofile"][1] * 2, out["nofile"][1] * 2))
            out["nofile_raised"] = True
        except (ValueError, OSError):
            out["nofile_raised"] = False
        ct = sys.modules["ctypes"]
        libc = ct.CDLL(None, use_errno=True)
        fds = (ct.c_int * 2)()
        out["pipe2"] = libc.pipe2(fds, 0)
        out["setpipe_sz"] = libc.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ of its output pipe
        print("REPORT " + json.dumps(out), flush=True)
    return 0
'''


@pytest.mark.parametrize("mode", MODES)
def test_kernel_objects_a_candidate_can_make_are_bounded(mode, memory_bound):
    """The scratch holds at most ``SCRATCH_INODES`` inodes, ``RLIMIT_NOFILE`` cannot be
    raised, and pipes and bigger pipe buffers are refused (named: ``blocked``)."""
    with _toy(mode, workers=1, timeout_s=60) as sb:
        ev = sb.evaluate(KERNEL_OBJECTS, {})
    assert ev.failure_kind == FailureKind.BLOCKED.value, ev
    assert "pipe2" in ev.message and "fcntl" in ev.message, ev.message
    got = _report(ev)
    assert SCRATCH_INODES - 16 <= got["dirs"] <= SCRATCH_INODES, got
    assert got["nofile"] == [isolation.MAX_FILES] * 2 and not got["nofile_raised"], got
    assert got["pipe2"] == -1 and got["setpipe_sz"] == -1, got


CORES = '''import json
import os
import time


def policy(contexts, history, t, state):
    if t == 0:
        out = {"cores": sorted(os.sched_getaffinity(0))}
        time.sleep(0.5)  # both candidates run at once
        try:
            os.sched_setaffinity(0, range(os.cpu_count()))
            out["widened"] = True
        except OSError as exc:
            out["widened"] = exc.errno
        print("REPORT " + json.dumps(out), flush=True)
    return 0
'''


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_runners_have_cores_of_their_own(mode):
    """Two workers on a machine with two cores or more: each worker's runners are bound to
    their own cores (so one candidate's load cannot slow a concurrent one through the
    scheduler, the contention channel of docs/sandbox.md), and a candidate cannot widen its
    set (``sched_setaffinity`` is refused, named: ``blocked``). The isolation line says so."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the sandbox shares it and says so (test_sandbox)")
    with _toy(mode, workers=2, timeout_s=60) as sb:
        evs = sb.evaluate_many([CORES, CORES], {})
        line = sb.isolation_line
    assert all(ev.failure_kind == FailureKind.BLOCKED.value for ev in evs), evs
    assert all("sched_setaffinity" in ev.message for ev in evs), evs
    got = [_report(ev) for ev in evs]
    assert sorted(tuple(g["cores"]) for g in got) == sorted(sb.cores), (got, sb.cores)
    assert not set(got[0]["cores"]) & set(got[1]["cores"]), got
    assert all(g["widened"] == 1 for g in got), got  # EPERM
    assert "cores: " + " | ".join(",".join(map(str, c)) for c in sb.cores) in line, line


COMBINED = '''import json
import os
import sys


def _slab_kb():
    with open("/proc/meminfo") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("Slab:"))


def policy(contexts, history, t, state):
    if t == 0:
        out = {"slab_before_kb": _slab_kb()}
        state["held"] = bytearray(HELD_MB << 20)
        for i in range(0, HELD_MB << 20, 4096):
            state["held"][i] = 1
        n = 0
        try:
            while n < 1000000:
                os.mkdir(f"d{n}")
                n += 1
        except OSError as exc:
            out["mkdir_error"] = exc.errno
        out["dirs"] = n
        ct = sys.modules["ctypes"]
        libc = ct.CDLL(None, use_errno=True)
        pipes = 0
        for _ in range(2000):
            fds = (ct.c_int * 2)()
            if libc.pipe2(fds, 0) != 0:
                break
            libc.fcntl(fds[1], 1031, 1 << 20)
            libc.write(fds[1], b"x" * (1 << 20), 1 << 20)
            pipes += 1
        out["pipes"] = pipes
        out["slab_after_kb"] = _slab_kb()
        print("REPORT " + json.dumps(out), flush=True)
        sys.modules["time"].sleep(1.5)
    return 0
'''


@pytest.mark.parametrize("held", [1700, 1990])
@pytest.mark.parametrize("mode", MODES)
def test_the_limit_holds_for_resident_memory_slab_and_pipes_together(mode, memory_bound, held):
    """The attack of issue 48 under a 2048 MB limit: ``held`` MB resident, then as many empty
    directories in its scratch as it can make (kernel slab), then pipes stuffed with 1 MB
    each. What it held stays within 10 % of the limit. At 1700 MB the scratch's inode limit
    and the refused pipes stop it, and it reports what the kernel counted (resident + the
    slab it added + pipe buffers); at 1990 MB it is killed at the limit, and the kill names
    what was counted (the cgroup's peak, or the watchdog's count plus the slab the inode
    limit allows). It is never scored."""
    with _toy(mode, workers=1, memory_mb=2048, timeout_s=120) as sb:
        assert (sb.cgroup is not None) == (memory_bound == "cgroup"), sb.isolation_line
        ev = sb.evaluate(COMBINED.replace("HELD_MB", str(held)), {})
        honest = sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {})
    assert not ev.passed and honest.passed, ev
    if "REPORT " not in ev.message:  # killed at the limit before reporting: what was counted
        assert ev.failure_kind == FailureKind.KILLED.value and "memory limit" in ev.message, ev
        counted = re.search(r"(?:peak|resident and scratch) (\d+) MB", ev.message)
        assert counted, ev.message  # the cgroup's peak, or the watchdog's count at the kill
        # the watchdog counts resident, page tables and scratch; the slab of the scratch's
        # inodes is bounded by its inode limit; the cgroup's peak counts everything
        slab_mb = 0 if memory_bound == "cgroup" else SCRATCH_INODES * INODE_BYTES / (1 << 20)
        assert int(counted.group(1)) + slab_mb <= 2048 * 1.1, ev.message
        return
    got = _report(ev)
    slab_mb = max(got["slab_after_kb"] - got["slab_before_kb"], 0) / 1024
    total = held + slab_mb + got["pipes"]
    assert total <= 2048 * 1.1, (total, got)
    assert got["dirs"] <= SCRATCH_INODES and got["pipes"] == 0, got


UNDUMPABLE = '''import json
import os
import sys


def policy(contexts, history, t, state):
    if t == 0:
        libc = sys.modules["ctypes"].CDLL(None, use_errno=True)
        out = {"set_dumpable_0": libc.prctl(4, 0, 0, 0, 0),  # PR_SET_DUMPABLE
               "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
               "set_name": libc.prctl(15, b"hider", 0, 0, 0)}  # PR_SET_NAME: allowed
        print("REPORT " + json.dumps(out), flush=True)
        state["held"] = bytearray(RESIDENT_MB << 20)
        for i in range(0, RESIDENT_MB << 20, 4096):
            state["held"][i] = 1
        chunk = b"x" * (1 << 20)
        with open("scratch.bin", "wb") as fh:
            for _ in range(SCRATCH_MB):
                fh.write(chunk)
        sys.modules["time"].sleep(2.0)
    return 0
'''


@pytest.mark.parametrize("mode", MODES)
def test_a_candidate_cannot_hide_its_scratch_from_the_watchdog(mode, memory_bound):
    """Issue 56's attack, scaled to a 256 MB limit: ``prctl(PR_SET_DUMPABLE, 0)`` (which kept
    /proc/<pid>/root from a watchdog of the same uid, so the scratch went uncounted), then
    150 MB resident and 290 MB in the scratch: 172 % of the limit. The prctl fails (seccomp
    refuses that option, and names it), the runner stays readable to its watchdog, and the
    program is never scored; other prctl options still work."""
    with _toy(mode, workers=1, memory_mb=256, timeout_s=60) as sb:
        probe = sb.evaluate(UNDUMPABLE.replace("RESIDENT_MB", "1").replace("SCRATCH_MB", "1"), {})
        ev = sb.evaluate(UNDUMPABLE.replace("RESIDENT_MB", "150").replace("SCRATCH_MB", "290"),
                         {})
        honest = sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {})
    # the call was made and refused, named; other options work
    assert probe.failure_kind == FailureKind.BLOCKED.value and "prctl" in probe.message, probe
    got = _report(probe)
    assert got["set_dumpable_0"] == -1 and got["set_name"] == 0, got
    # (a root runner switched uids, which leaves it not dumpable: a root watchdog reads it)
    assert ROOT or got["dumpable"] == 1, got
    # the whole attack: never scored; killed with its scratch counted, or blocked
    assert not ev.passed and honest.passed, ev
    if ev.failure_kind == FailureKind.KILLED.value:
        counted = re.search(r"(?:peak|resident and scratch) (\d+) MB", ev.message)
        assert counted and int(counted.group(1)) > 256, ev.message
    else:
        assert ev.failure_kind == FailureKind.BLOCKED.value and "prctl" in ev.message, ev


def test_a_scratch_the_watchdog_cannot_read_is_a_kill(monkeypatch):
    """Fail closed: where the watchdog finds a live runner's scratch but may not read it (the
    runner made itself not dumpable by a way the filter missed), the program is killed, not
    scored; simulated here by refusing the watchdog's statvfs through /proc/<pid>/root."""
    real = os.statvfs

    def refuse(path, *args, **kwargs):
        if str(path).startswith("/proc/") and "/root/" in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(cgroup, "make_base", lambda slots: (None, "not made, for the test"))
    with _toy("rlimits", workers=1, timeout_s=30) as sb:
        monkeypatch.setattr(os, "statvfs", refuse)
        ev = sb.evaluate("import time\n\ndef policy(c, h, t, s):\n    time.sleep(0.3)\n"
                         "    return 0\n", {})
        monkeypatch.setattr(os, "statvfs", real)
        honest = sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {})
    assert ev.failure_kind == FailureKind.KILLED.value, ev
    assert "hid its memory from the sandbox's watchdog" in ev.message, ev.message
    assert honest.passed, honest


@pytest.mark.parametrize("mode", MODES)
def test_a_runner_reads_only_the_code_its_task_needs(mode):
    """The toy task's runner reads its package, atlas's runner modules, the interpreter and
    the libraries it imports (numpy); not the checkout's root files, ``.git``, ``conf/``,
    ``docs/``, other atlas modules, or a library the task does not import (torch)."""
    import numpy

    allowed = [str(REPO / "atlas" / "sandbox" / "guard.py"), numpy.__file__, os.__file__,
               str(Path(numpy.__file__).parent / "linalg" / "__init__.py")]
    denied = [str(REPO / n) for n in ("README.md", "pyproject.toml", ".git", "conf/train.yaml",
                                      "docs/sandbox.md", "atlas/loop.py", "atlas/train.py")]
    torch = Path(sysconfig.get_paths()["purelib"]) / "torch" / "__init__.py"
    if torch.exists():
        denied.append(str(torch))
    code = ("import _io, json\n\ndef policy(contexts, history, t, state):\n"
            "    ok = []\n"
            f"    for p in {allowed + denied!r}:\n"
            "        try:\n            _io.FileIO(p, 'r').close()\n            ok.append(p)\n"
            "        except OSError:\n            pass\n"
            "    print('REPORT ' + json.dumps(ok), flush=True)\n    raise ValueError('done')\n")
    with _toy(mode, workers=1) as sb:
        ev = sb.evaluate(code, {})
    assert _report(ev) == allowed, ev.message


def test_the_code_view_of_the_built_in_tasks():
    """What a worker binds and a runner reads, per task: its package, the libraries it
    imports and their requirements, never the checkout's root or a run folder."""
    bandit = code_view(("atlas.tasks.bandit.evaluator:make_scorer",
                        "atlas.tasks.bandit.evaluator:make_runner"))
    names = {os.path.basename(p) for p in bandit.readable}
    assert str(REPO / "atlas" / "tasks" / "bandit") in bandit.readable
    assert {"numpy", "psutil"} <= names and "torch" not in names, names
    for p in (REPO, REPO / ".git", REPO / "conf", REPO / "outputs", REPO / "atlas"):
        assert str(p) not in bandit.readable and not any(
            str(p).startswith(r + "/") for r in bandit.readable), p
    assert all(os.path.basename(p) in ("site-packages", "dist-packages")
               for p in bandit.listable), bandit.listable
    pytest.importorskip("jax")
    pinn = code_view(("atlas.tasks.pinn.split:make_scorer", "atlas.tasks.pinn.split:make_runner"))
    names = {os.path.basename(p) for p in pinn.readable}
    assert {"jax", "jaxlib", "optax", "scipy", "numpy"} <= names, names


@pytest.mark.parametrize("mode", MODES)
def test_a_runners_proc_holds_only_its_own_files(mode):
    """The runner's /proc: its own process's files (bound from its pid namespace's /proc)
    and the machine's description, nothing that lists other entries: no fd, task or ns
    directory where a lookup would make a fresh inode."""
    code = ("import os, json\n\ndef policy(contexts, history, t, state):\n"
            "    out = {'self': os.readlink('/proc/self')}\n"
            "    try:\n        out['files'] = sorted(os.listdir('/proc/1'))\n"
            "    except OSError:\n        out['files'] = 'unlisted'\n"
            "    out['present'] = [p for p in ('/proc/self/fd', '/proc/self/task', "
            "'/proc/self/fdinfo', '/proc/self/ns', '/proc/thread-self', '/proc/self/mem', "
            "'/proc/2', '/proc/stat', '/proc/sys') if os.path.lexists(p)]\n"
            "    out['status'] = open('/proc/self/status').read().startswith('Name:')\n"
            "    print('REPORT ' + json.dumps(out), flush=True)\n    raise ValueError('done')\n")
    with _toy(mode, workers=1) as sb:
        got = _report(sb.evaluate(code, {}))
    assert got["self"] == "1" and got["status"] and got["present"] == [], got
    assert got["files"] in (sorted(PROC_FILES), "unlisted"), got


COUNTER = '''import json
import os
import sys


def policy(contexts, history, t, state):
    out = {"status": len({os.stat("/proc/self/status").st_ino for _ in range(2000)})}
    made = 0
    for path in ("/proc/self/fd/0", "/proc/self/task/1", "/proc/self/fdinfo/0",
                 "/proc/thread-self", "/proc/self/ns/net", "/proc/1/task"):
        try:
            os.stat(path)
            made += 1
        except OSError:
            pass
    out["proc_lookups"] = made
    ct = sys.modules["ctypes"]
    fds = (ct.c_int * 2)()
    out["pipe2"] = ct.CDLL(None).pipe2(fds, 0)
    print("REPORT " + json.dumps(out), flush=True)
    return 0
'''


@pytest.mark.parametrize("mode", MODES)
def test_the_pseudo_inode_counter_is_out_of_a_candidates_reach(mode):
    """Every pipe, socket and fresh /proc/<pid> inode takes the next number of a counter the
    whole machine shares, which fstat reads: a relay to the next candidate with no timing.
    A candidate can make none: pipes are refused (``blocked``, named), no /proc lookup makes
    an inode, and its /proc files keep theirs."""
    with _toy(mode, workers=1) as sb:
        ev = sb.evaluate(COUNTER, {})
    assert ev.failure_kind == FailureKind.BLOCKED.value and "pipe2" in ev.message, ev
    got = _report(ev)
    assert got["status"] == 1 and got["proc_lookups"] == 0, got
    assert got["pipe2"] == -1, got


def _private_interpreter(base: Path, minor_link: bool = False) -> Path:
    """An interpreter under ``base/home`` (0700), as pyenv or conda install one: its binary,
    shared library and standard library (hard links where the file system allows, its own
    site-packages left out). Returns the ``python`` inside; with ``minor_link``, reached
    through a folder link, as uv's ``cpython-3.x -> cpython-3.x.y`` (venvs name the link, so
    that a patch upgrade keeps them working)."""
    home = base / "home"
    home.mkdir(mode=0o700)
    prefix = home / ".pyenv" / "versions" / "py"
    if minor_link:
        prefix = home / ".local" / "share" / "uv" / "python" / "cpython-3.x.y"
        prefix.parent.mkdir(parents=True)
        (prefix.parent / "cpython-3.x").symlink_to("cpython-3.x.y")
    src = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix}))

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    skip = shutil.ignore_patterns("site-packages", "test", "tests", "idlelib", "tkinter",
                                  "__pycache__")
    shutil.copytree(stdlib, prefix / stdlib.relative_to(src), ignore=skip,
                    copy_function=link, symlinks=True)
    (prefix / "lib" / stdlib.name / "site-packages").mkdir()
    for lib in (src / "lib").glob("libpython*"):
        if lib.is_file():
            link(str(lib), str(prefix / "lib" / lib.name))
    (prefix / "bin").mkdir()
    exe = prefix / "bin" / Path(os.path.realpath(sys.executable)).name
    link(os.path.realpath(sys.executable), str(exe))
    return prefix.parent / "cpython-3.x" / "bin" / exe.name if minor_link else exe


PRIVATE = '''
import sys
from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER
code = ("def policy(contexts, history, t, state):\\n"
        "    import statistics, fractions, decimal, difflib, csv, email.parser, html.parser\\n"
        "    import xml.etree.ElementTree, zipfile, textwrap, heapq, bisect, itertools\\n"
        "    import numpy.linalg, numpy.fft\\n"
        "    return int(statistics.median([0, 0, 1]))\\n")
with Sandbox(TaskSpec(TOY_SCORER, {"steps": 2}, TOY_RUNNER, timeout_s=60),
             resources=Resources(workers=1), confinement=Confinement(isolation=sys.argv[1])) as sb:
    ev = sb.evaluate(code, {})
print("RESULT", sys.prefix, ev.passed, ev.failure_kind, ev.message[:800])
'''


@pytest.mark.parametrize("minor_link", [False, True], ids=["pyenv", "uv-minor-link"])
@pytest.mark.parametrize("mode", MODES)
def test_an_interpreter_in_a_private_home_imports_what_a_program_needs(mode, minor_link,
                                                                       tmp_path):
    """A Python living in a 0700 home folder (pyenv, conda; uv's, reached through a folder
    link): a runner, which has a uid of its own, imports any standard module and a task's
    library (numpy's submodules), none of them preloaded by the zygote."""
    exe = _private_interpreter(tmp_path, minor_link)
    sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *sites])
    env["PYTHONNOUSERSITE"] = "1"
    proc = subprocess.run([str(exe), "-c", PRIVATE, mode], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    assert line.split()[1].startswith(str(tmp_path / "home")), line
    assert line.split()[2] == "True", line


HOST_VIEW = r"""
import json, os, sys
from atlas.sandbox.namespaces import host_view
outside, top = sys.argv[1], sys.argv[2]
opened = host_view([outside + "/py", top + "/bin/py3.11"], [])
seen = {"opened": opened, "top": sorted(os.listdir(top))}
pid = os.fork()
if pid == 0:  # a uid that owns nothing, as a runner's
    os.setgid(0x70000123)
    os.setuid(0x70000123)
    try:
        with open(outside + "/py") as fh:
            os._exit(0 if fh.read() == "interpreter" else 3)
    except OSError:
        os._exit(4)
seen["runner"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print("VIEW", json.dumps(seen))
"""


@pytest.mark.skipif(not ROOT, reason="the host view is made by a root worker")
def test_a_venv_link_chain_into_a_private_home_resolves_in_the_host_view():
    """A venv outside the private home whose ``bin/python -> python3 -> /home/../python3 ->
    python3.11``, with the venv sorting first (a clone under /check, the home under /root):
    each link in the home is made again, the end is bound, and nothing else of the home
    shows."""
    base = Path(tempfile.mkdtemp(prefix="atlas-view-"))
    try:
        base.chmod(0o755)
        outside, top = base / "a-venv", base / "z-home"
        (top / "bin").mkdir(parents=True)
        (top / "bin" / "py3.11").write_text("interpreter")
        (top / "bin" / "py3").symlink_to("py3.11")
        (top / "secret").write_text("token")
        top.chmod(0o700)
        outside.mkdir()
        (outside / "py3").symlink_to(top / "bin" / "py3")
        (outside / "py").symlink_to("py3")
        proc = subprocess.run([sys.executable, "-c", HOST_VIEW, str(outside), str(top)],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("VIEW ")), None)
        assert line, proc.stderr[-3000:]
        seen = json.loads(line[5:])
        assert seen == {"opened": [str(top)], "top": ["bin"], "runner": 0}, seen
    finally:
        shutil.rmtree(base)


def test_the_task_checker_names_a_file_its_runner_may_not_read(monkeypatch):
    """A task whose runner reads atlas's conf/ at start: the checker fails it, naming the
    file, with what a runner may read and the fix."""
    from atlas.tasks.checker import check_task
    from tests.reading_task import OUTSIDE, ReadingTask

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the sandbox's processes import tests.*

    report = check_task(ReadingTask(T=50, env_seeds=[0, 1]), secrets=1, isolation="rlimits")
    line = next(c for c in report.checks if c.name == "files the runner reads")
    assert line.status == "fail" and OUTSIDE in line.detail, report.text()
    assert "keep the task's files in its package" in line.detail
    ok = check_task(ReadingTask.__mro__[1](T=50, env_seeds=[0, 1]), secrets=1,
                    isolation="rlimits")
    assert next(c for c in ok.checks if c.name == "files the runner reads").status == "ok"


def test_a_memory_cgroup_per_runner_where_one_can_be_made():
    """Where this process may make a memory cgroup (root, or a delegated cgroup v2 subtree),
    each ``Sandbox`` makes a directory with one per slot, removed at close; elsewhere it says
    why not, and the isolation line names the fallback."""
    base, why = cgroup.make_base(2)
    if base is None:
        with _toy("rlimits", workers=1) as sb:
            assert sb.cgroup is None and any(g.startswith("no memory cgroup") for g in
                                             sb.isolation_gaps)
        pytest.skip(f"no memory cgroup can be made here: {why}")
    try:
        assert sorted(os.listdir(base.path)).count("s0") == 1 and os.path.isdir(
            os.path.join(base.path, "s1"))
        group = cgroup.new_runner_cgroup(os.path.join(base.path, "s0"), base.version, 64)
        assert cgroup.oom_kills(group, base.version) == 0
        assert cgroup.remove(group)
    finally:
        cgroup.remove_tree(base.path)
    assert not os.path.exists(base.path)
    with _toy("rlimits", workers=1) as sb:
        assert sb.cgroup is not None and f"cgroup v{sb.cgroup.version}" in sb.isolation_line
        path = sb.cgroup.path
    assert not os.path.exists(path)


def test_cgroup_v2_is_preferred_where_its_memory_controller_is_delegated():
    """The cgroup v2 path: where this process's v2 cgroup offers the memory controller and
    lets it make children, the base is v2 (``memory.max``)."""
    own = dict(cgroup._own_dirs())
    v2 = own.get(2)
    if v2 is None:
        pytest.skip("no cgroup v2 hierarchy is mounted here")
    with open(os.path.join(v2, "cgroup.controllers")) as fh:
        if "memory" not in fh.read().split():
            pytest.skip(f"the cgroup v2 hierarchy here has no memory controller ({v2}: "
                        f"it is held by cgroup v1); not exercised")
    base, why = cgroup.make_base(1)
    try:
        assert base is not None and base.version == 2, why
    finally:
        if base is not None:
            cgroup.remove_tree(base.path)


def _residual():
    sys.path.insert(0, str(REPO / "scripts"))
    import residual_channels

    return residual_channels


@pytest.mark.parametrize("mode", MODES)
def test_the_residual_channels_carry_what_docs_sandbox_says(mode):
    """docs/sandbox.md's known channels, measured as written there
    (``scripts/residual_channels.py``, figures in ``docs/bench/residual_channels_<mode>.json``).
    To the next candidate, the page cache and negative directory entries still carry a
    message: the documented exception, bits and no score (each program faces inputs of its
    own; the relays that must fail are in ``test_relays.py``); if they stop carrying one,
    they closed and the docs must say so. To a concurrent candidate, CPU
    contention and free memory carry at most half their bits: a machine's load moves their
    figures (0-0.4 of 32 bits on the quiet EPYC, up to 9.7 beside other jobs), a channel that
    grew into a working one passes that bound."""
    import random

    rc = _residual()
    rng = random.Random(3)
    with _toy(mode, workers=2, timeout_s=120, memory_mb=1024) as sb:
        names = rc.dentry(sb, rng, 64)
        pages = rc.page_cache(sb, rng, 64) if rc.drop_caches() else None
        cpu = rc.concurrent(sb, rng, 32, 0.01, rc.SENDER_CPU, rc.RECEIVER_CPU)
        mem = rc.concurrent(sb, rng, 32, 0.1, rc.SENDER_MEM, rc.RECEIVER_MEM, mb=256)
    # a closed channel guesses: about half of its 64 bits wrong; an open one on a loaded
    # machine gets a few wrong (the docs' figures: 0 and 1 of 256)
    assert "error" not in names and names["errors"] <= 8, names
    assert names["median_us_sent_1"] * 1.5 < names["median_us_sent_0"], names
    if pages is not None:
        assert "error" not in pages and pages["cold_start"] and pages["errors"] <= 8, pages
    for got in (cpu, mem):
        assert "error" not in got and got["capacity_bits"] <= got["bits_sent"] / 2, got
