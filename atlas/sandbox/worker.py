"""Trusted scorer process: ``python -m atlas.sandbox.worker --req-fd R --resp-fd W``.

Why two kinds of process: whatever computes a score must never execute candidate code, or
the candidate can read the hidden environment, patch the scorer or forge the result. This
process holds the task's secret and its scorer (environments, validation points, compiled
JAX functions); it never runs candidate code. At start, *before* it reads the secret, it forks
the zygote (``runner.py``); per candidate it has the zygote fork a fresh runner, talks to it
over a ``Link`` that only this side interprets, kills it after the one candidate and wipes
every file it could have left. One runner is always kept ready (spare), so a task's warm-up
(JAX compilation) overlaps the previous candidate and the agent's generation.

Every task is split: ``scorer.score(code, context, link)`` runs here, the task's runner
(``runner_factory``) there.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from atlas.sandbox import cgroup, protocol
from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.isolation import harden_worker, set_process_name
from atlas.sandbox.link import Link, RunnerFailed
from atlas.sandbox.namespaces import host_view, keep_scorer_caps
from atlas.sandbox.runner import DENIED_PATH, load_factory, zygote_main
from atlas.sandbox.seccomp import Supervisor
from atlas.types import Evaluation, FailureKind


class OutputSink:
    """Drain a runner's stdout/stderr pipe so it never blocks; keep the first ``cap`` bytes."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.head = bytearray()
        self.total = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                chunk = protocol._os_read(self.fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self.total += len(chunk)
            room = self.cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]

    def text(self) -> str:
        self.thread.join(timeout=1.0)
        text = self.head.decode("utf-8", "replace")
        if self.total > len(self.head):
            text += f"\n[... {self.total - len(self.head)} more bytes dropped]"
        return text


@dataclass
class Runner:
    """A forked runner process as the scorer sees it."""

    pid: int
    link: Link
    out_r: int
    sink: OutputSink
    workdir: str = ""
    supervisor: Supervisor | None = None
    cgroup: str = ""

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the zygote reaps it (SIGCHLD ignored)
            try:
                os.kill(self.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.002)
        self.link.close()


class Frozen:
    """Directories a scorer shares with runners read-only in effect (e.g. a compilation
    cache): their exact content is captured once and restored after every candidate, since
    under bubblewrap a runner has the same uid and could otherwise write there."""

    def __init__(self, dirs: list[str]) -> None:
        self.dirs = [os.path.realpath(d) for d in dirs]
        self.files: dict[str, bytes] = {}
        for d in self.dirs:
            os.chmod(d, 0o755)
            for root, _, names in os.walk(d):
                os.chmod(root, 0o755)
                for name in names:
                    path = os.path.join(root, name)
                    os.chmod(path, 0o644)
                    with open(path, "rb") as fh:
                        self.files[path] = fh.read()

    def restore(self) -> None:
        for d in self.dirs:
            for root, subdirs, names in os.walk(d, topdown=False):
                for name in names:
                    path = os.path.join(root, name)
                    if path not in self.files:
                        os.unlink(path)
                for name in subdirs:
                    path = os.path.join(root, name)
                    if not any(f.startswith(path + "/") for f in self.files):
                        shutil.rmtree(path, ignore_errors=True)
        for path, data in self.files.items():
            try:
                with open(path, "rb") as fh:
                    same = fh.read() == data
            except OSError:
                same = False
            if not same:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(data)
                os.chmod(path, 0o644)


def scorer_bug(exc: BaseException, scorer: Any) -> str:
    """The message of an exception the task's own scorer raised: where in the task's code
    (the innermost frame in the scorer's package, else the innermost frame), what, and the end
    of the traceback, which holds the cause.

    Why its own kind: a scorer blames the candidate only by raising ``CandidateError``,
    ``RunnerFailed`` or ``ProtocolError``; anything else is a bug in the task, and labelling
    it a candidate's fault would have the run select against every program.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    module = sys.modules.get(type(scorer).__module__ if scorer is not None else "")
    path = getattr(module, "__file__", None) or ""
    # the task's code: the scorer module's package directory (the module alone at top level)
    root = os.path.dirname(path) + os.sep if "." in getattr(module, "__name__", "") else path
    ours = [f for f in frames if root and f.filename.startswith(root)]
    frame = (ours or frames or [None])[-1]
    where = f" at {frame.filename}:{frame.lineno}" if frame is not None else ""
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-1200:]
    return (f"the task's scorer raised {type(exc).__name__}: {exc}{where} (a bug in the task, "
            f"not the program: a scorer blames a program only by raising CandidateError)"
            f"\n{tail}")[:2000]


def _sweep(root: str, keep: set[str]) -> None:
    """Delete every entry under ``root`` except ``keep`` (a runner's leftovers)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        if path in keep:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


class Worker:
    """The request loop of one scorer process."""

    def __init__(self, req_fd: int, resp_fd: int, zygote: socket.socket,
                 init: dict[str, Any]) -> None:
        self.req_fd, self.resp_fd, self.zygote = req_fd, resp_fd, zygote
        self.memory_mb = int(init["memory_mb"])
        self.timeout_s = float(init["timeout_s"])
        self.max_output = int(init["max_output_bytes"])
        # scratch: the private /tmp under bubblewrap, the pool's directory otherwise; every
        # entry but the scorer's own directory is wiped after each candidate
        self.scratch = init.get("tmp_root") or tempfile.gettempdir()
        if os.getuid() == 0:  # runners drop to a fresh uid and must reach their directories
            os.chmod(self.scratch, 0o711)
        self.scratch_mode = os.stat(self.scratch).st_mode & 0o7777
        self.base = tempfile.mkdtemp(prefix="atlas-scorer-", dir=self.scratch)
        os.chmod(self.base, 0o700)
        tempfile.tempdir = self.base
        os.environ["TMPDIR"] = self.base
        factory = load_factory(init["factory"])
        config = dict(init["config"])
        params = inspect.signature(factory).parameters
        self.scorer = (factory(config, secret=init["secret"]) if "secret" in params
                       else factory(config))
        public = getattr(self.scorer, "public_config", None)
        self.spec = {"factory": init["runner_factory"],
                     "config": public() if callable(public) else {}}
        self.audit = bool(init.get("audit"))
        self.calls: dict[str, int] = {}
        self.spec.update(memory_mb=self.memory_mb, timeout_s=self.timeout_s,
                         hide=list(init.get("hide") or []), readable=init.get("readable"),
                         listable=list(init.get("listable") or []),
                         syscalls=list(init.get("syscalls") or []), audit=self.audit)
        #: where this worker makes each runner's memory cgroup: {"dir", "version"} or None
        self.memory_cgroup = init.get("cgroup")
        self.stale: list[str] = []  # runner cgroups still busy when their runner ended
        self.next_cgroup = ""  # where the zygote waits to fork the next runner
        self.oom_peak: float | None = None  # set when the kernel stopped a runner at the limit
        shared = getattr(self.scorer, "shared_dirs", None)
        self.frozen = Frozen(shared() if callable(shared) else [])
        self.spare: Runner | None = None

    def spawn(self) -> Runner:
        """Have the zygote fork a runner; it warms up while we go on. Its working directory
        is made here and gets the runner's own tmpfs there (``private_scratch``)."""
        if os.stat(self.scratch).st_mode & 0o7777 != self.scratch_mode:  # a candidate's chmod
            os.chmod(self.scratch, self.scratch_mode)
        workdir = tempfile.mkdtemp(prefix="cand-", dir=self.scratch)
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        out_r, out_w = os.pipe()
        sup_ours, sup_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        group, after = self._runner_cgroups()
        try:
            socket.send_fds(self.zygote, [json.dumps({**self.spec, "workdir": workdir,
                                                      "cgroup": group, "cgroup_next": after}
                                                     ).encode()],
                            [to_r, from_w, out_w, sup_theirs.fileno()])
            reply = self.zygote.recv(1 << 16)
            if not reply:  # the sandbox broke, not the task: the program is not scored
                raise RunnerFailed(FailureKind.KILLED, "the sandbox zygote died")
            pid = int(json.loads(reply)["pid"])
        finally:
            for fd in (to_r, from_w, out_w):
                os.close(fd)
            sup_theirs.close()
        return Runner(pid, Link(from_r, to_w, trusted=True), out_r,
                      OutputSink(out_r, self.max_output), workdir,
                      Supervisor(sup_ours, audit=self.audit), group)

    def _runner_cgroups(self) -> tuple[str, str]:
        """(the memory cgroup of the runner about to be forked, the one of the next): the
        zygote waits in the next one between forks ('' where no cgroup can be made)."""
        at = self.memory_cgroup
        if not at:
            return "", ""

        def fresh() -> str:
            return cgroup.new_runner_cgroup(at["dir"], int(at["version"]), self.memory_mb)

        group = self.next_cgroup or fresh()
        self.next_cgroup = fresh()
        return group, self.next_cgroup

    def _start(self, runner: Runner, code: str, context: dict[str, Any]) -> None:
        """Wait for ``runner`` to be ready and hand it the program."""
        runner.link.recv()  # "ready": the task's runner has warmed up
        runner.link.send({"code": code, "context": context, "workdir": runner.workdir})

    def _end(self, runner: Runner, ours: set[str]) -> str:
        """Kill ``runner`` and wipe everything it could have left; its output."""
        runner.kill()
        if runner.supervisor is not None:
            for name, count in runner.supervisor.finish().items():
                self.calls[name] = self.calls.get(name, 0) + count
        output = runner.sink.text()
        try:
            os.close(runner.out_r)
        except OSError:  # already ended (a fresh runner failed to start)
            pass
        _sweep(self.scratch, {self.base, *self.frozen.dirs})
        _sweep(self.base, ours)
        self.frozen.restore()
        if runner.cgroup:
            version = int(self.memory_cgroup["version"])
            if cgroup.oom_kills(runner.cgroup, version):
                self.oom_peak = cgroup.peak_mb(runner.cgroup, version) or math.nan
            self.stale = [g for g in [*self.stale, runner.cgroup]
                          if not cgroup.remove(g, wait_s=0.05)]
        if self.scratch == "/tmp":
            _sweep("/dev/shm", set())
        return output

    def evaluate(self, code: str, context: dict[str, Any]) -> tuple[Evaluation, str]:
        runner, self.spare = self.spare or self.spawn(), None
        # under bubblewrap a runner has this process's uid: what it adds to our own directory
        # (kept by the sweep of the scratch) goes too, where Landlock is missing
        ours = {os.path.join(self.base, n) for n in os.listdir(self.base)}
        outputs: list[str] = []
        self.calls = {}
        self.oom_peak = None

        def fresh() -> Link:
            """End the candidate's runner and start the same program in a new one that knows
            nothing the first learned (a scorer's audit: ``score(..., fresh=)``); its link."""
            nonlocal runner
            outputs.append(self._end(runner, ours))
            runner = self.spawn()
            self._start(runner, code, context)
            return runner.link

        try:
            self._start(runner, code, context)
            if "fresh" in inspect.signature(self.scorer.score).parameters:
                ev = self.scorer.score(code, context, runner.link, fresh=fresh)
            else:
                ev = self.scorer.score(code, context, runner.link)
            if not isinstance(ev, Evaluation):
                raise TypeError(f"the scorer returned {type(ev).__name__}, not an "
                                f"Evaluation (a task bug)")
            if ev.passed and not (isinstance(ev.score, (int, float))
                                  and math.isfinite(ev.score)):
                raise CandidateError(FailureKind.NON_FINITE, f"the score is {ev.score!r}")
            try:  # what the parent will accept, checked here where the task is blamed
                protocol.validate_evaluation(json.loads(protocol.encode(ev.to_dict())[protocol.HEADER.size:]))
            except (TypeError, protocol.ProtocolError) as exc:
                raise TypeError(f"the scorer returned an invalid Evaluation ({exc}); "
                                f"metrics must map str to Python floats") from None
        except RunnerFailed as exc:
            ev = Evaluation.failure(exc.kind, exc.message)
        except CandidateError as exc:
            ev = Evaluation.failure(exc.kind, exc.message)
        except protocol.ProtocolError as exc:
            ev = Evaluation.failure(FailureKind.TAMPERED, f"the program's answer could not be "
                                    f"scored ({type(exc).__name__}: {exc})"[:1500])
        except Exception as exc:  # noqa: BLE001 - the scorer is trusted: its own bug
            ev = Evaluation.failure(FailureKind.TASK_ERROR, scorer_bug(exc, self.scorer))
        finally:
            outputs.append(self._end(runner, ours))
        if self.oom_peak is not None:  # whatever the scorer made of the runner's death
            peak = (f"peak {self.oom_peak:.0f} MB" if math.isfinite(self.oom_peak)
                    else "its peak not reported by this kernel")
            ev = Evaluation.failure(
                FailureKind.KILLED, f"the program exceeded the memory limit of "
                f"{self.memory_mb} MB (counted by the kernel's memory cgroup: resident, "
                f"kernel and scratch memory, {peak}) and was killed")
        if self.audit:  # the calls the runner made, as metrics: what the audit command prints
            ev.metrics.update({f"syscall:{k}": float(v) for k, v in self.calls.items()})
            ev.metrics.update({f"path:{line[len(DENIED_PATH):]}": 1.0
                               for text in outputs for line in text.splitlines()
                               if line.startswith(DENIED_PATH)})
        elif self.calls:  # the candidate's fault, whatever it scored: the task names the fix
            names = ", ".join(sorted(self.calls))
            ev = Evaluation.failure(
                FailureKind.BLOCKED, f"the program made system call(s) the sandbox does not "
                f"allow: {names} (they failed with EPERM). A task that needs one lists it in "
                f"Task.syscalls; python -m atlas.sandbox audit task=<name> prints what a "
                f"runner calls")
        return ev, "".join(outputs)

    def serve(self) -> None:
        self.spare = self.spawn()
        while True:
            req = protocol.read_frame(self.req_fd)
            if req is None or req.get("type") == "exit":
                return
            ev, output = self.evaluate(str(req["code"]), dict(req.get("context") or {}))
            if not ev.passed and output.strip() and "program output:" not in ev.message:
                ev.message = (ev.message + f"\nprogram output: {output[-1500:]}")[:2000]
            protocol.write_frame(self.resp_fd, {"type": "result", "id": req["id"],
                                                "nonce": req["nonce"],
                                                "evaluation": ev.to_dict()})
            self.spare = self.spawn()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--req-fd", type=int, required=True)
    parser.add_argument("--resp-fd", type=int, required=True)
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--view", default="", help="JSON {readable, masks}: the host view "
                        "of a worker of the rlimits mode running as root (namespaces.host_view)")
    parser.add_argument("--cores", default="", help="the cores this worker and its runners "
                        "are bound to (Sandbox.cores), comma-separated")
    args = parser.parse_args(argv)
    if args.cores:
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    harden_worker()
    if args.view:  # before the zygote, which its runners fork from
        view = json.loads(args.view)
        host_view(view["readable"], view["masks"])
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:  # the zygote: forked before the secret exists in this process
        mine.close()
        os.close(args.req_fd)
        os.close(args.resp_fd)
        zygote_main(theirs, args.preload)
    theirs.close()
    keep_scorer_caps()
    set_process_name("atlas-scorer")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    init = protocol.read_frame(args.req_fd)
    if init is None:
        return 0
    try:
        worker = Worker(args.req_fd, args.resp_fd, mine, init)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent verbatim
        protocol.write_frame(args.resp_fd, {
            "type": "error", "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:]})
        return 2
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    protocol.write_frame(args.resp_fd, {"type": "ready", "pid": os.getpid()})
    try:
        worker.serve()
    finally:
        shutil.rmtree(worker.base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
