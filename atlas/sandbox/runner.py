"""Untrusted side of the sandbox: the zygote and the single-use runner processes it forks.

Why a zygote: a candidate must run in a process that never held the task's secret or the
environment (a fork of the scorer would still hold both in memory), yet starting a Python
that imports numpy per candidate costs ~0.2 s. The scorer worker forks the zygote at start,
*before* it reads the secret; the zygote imports numpy (and, for fork-safe tasks, the
runner module) and then forks one runner per candidate on request.

A runner: (1) right after its fork, takes a pid and mount namespace of its own, mounts a
tmpfs that only it sees on its directory and a /proc of its own (``namespaces``), and drops
root before any task code; (2) builds the task's runner (trusted task code: imports, JAX
compilation) and says ``ready``; (3) receives the candidate's code, takes rlimits, seccomp,
Landlock (reads of its task's code, writes only in its directory) and the guard, runs the
candidate through the task's runner, and exits. It is killed after that one candidate, so
nothing it did (threads, patched modules, files in its directory) can reach another
candidate.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import tempfile
import traceback
import zlib
from typing import Any, NoReturn

from atlas.sandbox import cgroup, protocol
from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.guard import Guard
from atlas.sandbox.isolation import (
    _PR_SET_CHILD_SUBREAPER,
    limit_candidate_process,
    process_state,
    reset_process_state,
    set_process_name,
)
from atlas.sandbox.landlock import restrict_writes
from atlas.sandbox.link import Link
from atlas.sandbox.namespaces import (
    RUNNER_UID_BASE,
    RUNNER_UIDS,
    _prctl,
    host_root,
    own_process_tree,
    prepare_runner,
)
from atlas.sandbox.seccomp import install_seccomp, no_new_privs
from atlas.sandbox.view import candidate_readable
from atlas.types import FailureKind

_os_exit = os._exit


def load_factory(path: str) -> Any:
    """Import ``"module:function"``."""
    import importlib

    module, _, name = path.partition(":")
    factory = getattr(importlib.import_module(module), name, None)
    if not callable(factory):
        raise ValueError(f"factory {path!r}: {module} has no callable {name!r}")
    return factory


def seed_candidate_rngs(context: dict[str, Any]) -> int:
    """Seed ``random`` and ``numpy.random`` from the regime (the context without its round),
    so a program that draws from them unseeded scores the same in two runs, on resume, and
    with any comment added: a seed from the program's text would let an optimiser keep the
    luckiest of many copies that differ only in a comment."""
    regime = json.dumps({k: v for k, v in context.items() if k != "round"}, sort_keys=True)
    seed = zlib.crc32(regime.encode("utf-8", "replace"))
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    return seed


def drop_root(workdir: str) -> int | None:
    """As root of the host, become a fresh unprivileged uid of this runner's own; its uid
    (None where nothing was switched: not root, or root of a user namespace only)."""
    if not host_root():
        return None
    uid = RUNNER_UID_BASE + int.from_bytes(os.urandom(3), "big") % RUNNER_UIDS
    os.chown(workdir, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    return uid


def classify(exc: BaseException) -> tuple[str, str]:
    """(failure kind, message) for whatever escaped candidate code."""
    if isinstance(exc, CandidateError):
        return exc.kind.value, exc.message
    if isinstance(exc, MemoryError):
        return FailureKind.KILLED.value, f"out of memory: {exc!r}"[:500]
    if isinstance(exc, SystemExit):
        return FailureKind.EXCEPTION.value, (f"the program called sys.exit({exc.code!r}); a "
                                             f"program must return from its entry point")
    text = f"{type(exc).__name__}: {exc}"
    if "Unable to allocate" in text:
        return FailureKind.KILLED.value, f"out of memory: {text}"[:1500]
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f" (line {f.lineno})" for f in reversed(tb) if f.filename == "<candidate>"),
                 "")
    return FailureKind.EXCEPTION.value, f"{type(exc).__name__}{where}: {exc}"[:1500]


#: how a runner in audit mode names a path it opened outside what it may read
DENIED_PATH = "atlas-denied-path: "


def _record_denied(spec: dict[str, Any]) -> None:
    """In audit mode: name on the output (``DENIED_PATH``) every path this process opens
    outside what a runner may read (the task's runner needs it, the sandbox hides it), at
    once: the scorer kills the runner as soon as it has its answer. Listings are left out:
    the import system lists every folder of the import path, and goes on."""
    allowed = [*(spec.get("readable") or ()), *(spec.get("listable") or ()), "/proc", "/dev",
               spec.get("workdir") or "/nonexistent", *(spec.get("hide") or ())]
    named: set[str] = set()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, bytes)):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if path in named or any(path == r or path.startswith(r.rstrip("/") + "/")
                                for r in allowed):
            return
        named.add(path)
        protocol._os_write(1, (DENIED_PATH + path + "\n").encode())

    sys.addaudithook(hook)


def _run_one(spec: dict[str, Any], link: Link) -> None:
    if spec.get("audit"):
        _record_denied(spec)
    _run_candidate(spec, link)


def _run_candidate(spec: dict[str, Any], link: Link) -> None:
    try:
        task_runner = load_factory(spec["factory"])(dict(spec["config"]))
    except BaseException as exc:  # noqa: BLE001 - a task bug, reported verbatim
        link.send({"error": FailureKind.EXCEPTION.value,
                   "message": f"the task's runner failed to start: {type(exc).__name__}: "
                              f"{exc}\n{traceback.format_exc()[-1500:]}"})
        return
    link.send({"ready": True})
    set_process_name("atlas-runner")
    req = link.recv()
    code, context = str(req["code"]), dict(req.get("context") or {})
    workdir = spec.get("workdir") or req["workdir"]
    os.chdir(workdir)
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    tempfile.tempdir = workdir
    cpu_used = sum(os.times()[:2])
    limit_candidate_process(int(spec["memory_mb"]), cpu_used + float(spec["timeout_s"]),
                            nproc="nproc" in spec.get("got", ()))
    no_new_privs()  # what Landlock and seccomp need; Landlock first: seccomp refuses it
    readable = spec.get("readable")
    restrict_writes(workdir, spec.get("hide") or (),
                    None if readable is None else candidate_readable(readable),
                    spec.get("listable") or ())
    supervisor = socket.socket(fileno=spec["sup_fd"]) if spec.get("sup_fd") else None
    install_seccomp(supervisor, extra=spec.get("syscalls") or (), audit=bool(spec.get("audit")))
    seed_candidate_rngs(context)
    guard = Guard(workdir, protected_fds=(link.read_fd, link.write_fd),
                  hidden=spec.get("hide") or ())
    link.violations = guard.violations
    reply: dict[str, Any] | None = None
    try:
        guard.install()
        task_runner(code, context, link)
    except BaseException as exc:  # noqa: BLE001 - everything a candidate raises is classified
        kind, message = classify(exc)
        reply = {"error": kind, "message": message}
    finally:
        guard.uninstall()
    if guard.violations:
        reply = {"error": FailureKind.EXCEPTION.value, "message": guard.violations[0]}
    if reply is not None:
        link.send(reply)


def runner_main(spec: dict[str, Any], read_fd: int, write_fd: int, out_fd: int,
                sup_fd: int, report_fd: int) -> NoReturn:
    """Body of a freshly forked runner; never returns. It first becomes pid 1 of a pid
    namespace of its own (``own_process_tree``), reporting its pid on ``report_fd``."""
    status = 0
    try:
        got = own_process_tree(report_fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = sorted({0, 1, 2, read_fd, write_fd, sup_fd})  # report_fd is closed by now
        spec["sup_fd"] = sup_fd
        low = 3
        for fd in keep[3:] + [1 << 16]:
            if fd > low:
                os.closerange(low, fd)
            low = fd + 1
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if spec.get("workdir"):  # a fresh filesystem for this one candidate
            got = prepare_runner(spec["workdir"], int(spec["memory_mb"]), got,
                                 hide=spec.get("hide") or [],
                                 keep=[*(spec.get("readable") or ["/"]),
                                       *(spec.get("listable") or ())])
        reset_process_state(spec["state"])
        if spec.get("workdir") and drop_root(spec["workdir"]) is not None:
            got.add("nproc")  # before the task's code: a runner never holds root
        spec["got"] = sorted(got)
        _run_one(spec, Link(read_fd, write_fd, trusted=False))
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        status = 70
        try:  # the sandbox's own failure: its cause goes to the program's output
            traceback.print_exc()
        except Exception:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001
            pass
        _os_exit(status)


def zygote_main(sock: socket.socket, preload: list[str]) -> NoReturn:
    """Fork runners on request: each request is JSON + 4 fds (read, write, output, the
    seccomp supervisor's socket).

    A runner is forked inside its memory cgroup (``spec["cgroup"]``): the zygote waits in
    it, having moved there after the previous fork (``spec["cgroup_next"]``). Why not move
    the runner: moving a process into a cgroup waits for the kernel's RCU grace period
    (~15 ms here), which would delay every candidate; the zygote moves while idle."""
    status = 0
    here = ""
    try:
        set_process_name("atlas-zygote")
        # runners are reaped automatically, also once their namespace's first process (which
        # forked them) has exited and they were reparented here
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        state = process_state()  # before any runner: what each runner starts from
        for module in ["numpy", *preload]:
            try:
                __import__(module)
            except ImportError:
                pass
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
            if not msg:
                break
            spec = dict(json.loads(msg), state=state)
            if spec.get("cgroup") and spec["cgroup"] != here:
                cgroup.join(spec["cgroup"])
                here = spec["cgroup"]
            report_r, report_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(report_r)
                runner_main(spec, *fds, report_w)
            os.close(report_w)
            for fd in fds:
                os.close(fd)
            with os.fdopen(report_r, "rb") as fh:
                reported = fh.read(32)
            sock.send(json.dumps({"pid": int(reported) if reported else pid}).encode())
            if spec.get("cgroup_next"):  # while idle: where the next runner will be forked
                cgroup.join(spec["cgroup_next"])
                here = spec["cgroup_next"]
    except BaseException:  # noqa: BLE001
        status = 70
    finally:
        _os_exit(status)
