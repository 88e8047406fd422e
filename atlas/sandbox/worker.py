"""Sandbox worker process: ``python -m atlas.sandbox.worker --req-fd R --resp-fd W``.

Why a long-lived worker: the task's evaluator factory (JAX compilation for PINN) is paid
once per worker, not per candidate. Two ways to run a candidate:

- fork-safe evaluators: fork a fresh child from the warm worker per candidate; the child
  closes the protocol fds, moves into its own temp dir, takes rlimits + seccomp + guard,
  evaluates, writes one nonce-stamped frame to a private pipe and exits. Nothing a candidate
  does survives it.
- ``fork_safe = False`` (JAX): the candidate runs in the worker itself (seccomp installed
  after warm-up); the parent recycles the worker after any non-ok result and every N.

The parent alone enforces wall time and memory (it kills processes); the worker only reports.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import traceback
import zlib
from collections.abc import Callable
from typing import Any

from atlas.sandbox import protocol
from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.guard import Guard
from atlas.sandbox.isolation import harden_worker, limit_candidate_process
from atlas.sandbox.seccomp import install_seccomp
from atlas.types import Evaluation, FailureKind

Evaluator = Callable[[str, dict[str, Any]], Evaluation]
_os_exit = os._exit


def load_factory(path: str) -> Callable[[dict[str, Any]], Evaluator]:
    """Import ``"module:function"``."""
    module, _, name = path.partition(":")
    factory = getattr(importlib.import_module(module), name, None)
    if not callable(factory):
        raise ValueError(f"evaluator_factory={path!r}: {module} has no callable {name!r}")
    return factory


def _open_fds() -> set[int]:
    try:
        return {int(fd) for fd in os.listdir("/proc/self/fd")} - {0, 1, 2}
    except OSError:
        return set()


def seed_candidate_rngs(code: str, context: dict[str, Any]) -> int:
    """Seed the global ``random`` and ``numpy.random`` generators from (round, code).

    Why: a candidate that draws from them unseeded would otherwise see the worker's
    entropy-seeded state, so one program could score differently in two runs with the same
    seed, and a resumed run could not reproduce an uninterrupted one.
    """
    key = f"{context.get('round', 0)!r}\0{code}".encode("utf-8", "replace")
    seed = zlib.crc32(key)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    return seed


def evaluate_guarded(evaluator: Evaluator, code: str, context: dict[str, Any],
                     workdir: str) -> Evaluation:
    """Run the evaluator under the guard and classify whatever comes out of it."""
    seed_candidate_rngs(code, context)
    guard = Guard(workdir, protected_fds=_open_fds())
    result: Any = None
    try:
        guard.install()
        result = evaluator(code, context)
    except CandidateError as exc:
        result = Evaluation.failure(exc.kind, exc.message)
    except MemoryError as exc:
        result = Evaluation.failure(FailureKind.KILLED, f"out of memory: {exc!r}"[:500])
    except SystemExit as exc:
        result = Evaluation.failure(FailureKind.EXCEPTION,
                                    f"the program called sys.exit({exc.code!r}); a program must "
                                    f"return from its entry point instead of exiting")
    except RecursionError as exc:
        result = Evaluation.failure(FailureKind.EXCEPTION, f"RecursionError: {exc}")
    except BaseException as exc:  # noqa: BLE001 - everything a candidate raises is classified
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f" (line {f.lineno})" for f in reversed(tb)
                      if f.filename == "<candidate>"), "")
        result = Evaluation.failure(FailureKind.EXCEPTION,
                                    f"{type(exc).__name__}{where}: {exc}")
    finally:
        guard.uninstall()
    if guard.violations:
        return Evaluation.failure(FailureKind.EXCEPTION, guard.violations[0])
    if not isinstance(result, Evaluation):
        return Evaluation.failure(FailureKind.EXCEPTION,
                                  f"the evaluator returned {type(result).__name__}, "
                                  f"not an Evaluation (a task bug)")
    if result.failure_kind == FailureKind.EXCEPTION.value and (
            "MemoryError" in result.message or "Unable to allocate" in result.message):
        result.failure_kind = FailureKind.KILLED.value
        result.message = f"out of memory: {result.message}"
    if result.passed and not math.isfinite(result.score):
        return Evaluation.failure(FailureKind.NON_FINITE, f"score is {result.score}")
    return result


class OutputSink:
    """Drain a candidate's stdout/stderr pipe so it never blocks; keep the first ``cap``
    bytes (a flood of output costs the candidate time, never memory or a hang)."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.head = bytearray()
        self.total = 0
        self._lock = threading.Lock()
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
            with self._lock:
                self.total += len(chunk)
                room = self.cap - len(self.head)
                if room > 0:
                    self.head += chunk[:room]

    def take(self) -> str:
        """The captured text so far, then reset (in-process workers reuse one sink)."""
        with self._lock:
            text = self.head.decode("utf-8", "replace")
            if self.total > len(self.head):
                text += f"\n[... {self.total - len(self.head)} more bytes dropped]"
            self.head, self.total = bytearray(), 0
        return text


def _describe_status(status: int) -> tuple[FailureKind, str]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        hint = {signal.SIGSEGV: " (a crash, e.g. a stack overflow from deep recursion)",
                signal.SIGXCPU: " (CPU time limit)"}.get(sig, "")
        return FailureKind.KILLED, f"the program was killed by signal {name}{hint}"
    code = os.WEXITSTATUS(status)
    return FailureKind.EXCEPTION, f"the program ended the process (exit status {code}) " \
                                  f"before returning a result"


class Worker:
    """The request loop; one instance per worker process."""

    def __init__(self, req_fd: int, resp_fd: int, init: dict[str, Any]) -> None:
        self.req_fd, self.resp_fd = req_fd, resp_fd
        self.memory_mb = int(init["memory_mb"])
        self.timeout_s = float(init["timeout_s"])
        self.max_output = int(init["max_output_bytes"])
        self.base = tempfile.mkdtemp(prefix="atlas-worker-", dir=init.get("tmp_root"))
        os.environ["TMPDIR"] = self.base
        tempfile.tempdir = self.base
        self.evaluator = load_factory(init["factory"])(dict(init["config"]))
        self.fork_safe = bool(getattr(self.evaluator, "fork_safe", True))
        self.sink: OutputSink | None = None

    def prepare(self) -> None:
        """After warm-up: silence the worker's own output; lock down an in-process worker."""
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        if self.fork_safe:
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        else:
            out_r, out_w = os.pipe()
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.close(out_w)
            self.sink = OutputSink(out_r, self.max_output)
            limit_candidate_process(self.memory_mb, None)
            install_seccomp()
        os.close(devnull)

    def _workdir(self) -> str:
        return tempfile.mkdtemp(prefix="cand-", dir=self.base)

    def run_inline(self, code: str, context: dict[str, Any]) -> tuple[Evaluation, str]:
        workdir = self._workdir()
        env = dict(os.environ)
        try:
            os.chdir(workdir)
            os.environ.update(HOME=workdir, TMPDIR=workdir)
            tempfile.tempdir = workdir
            ev = evaluate_guarded(self.evaluator, code, context, workdir)
        finally:
            os.chdir(self.base)
            os.environ.clear()
            os.environ.update(env)
            tempfile.tempdir = self.base
            shutil.rmtree(workdir, ignore_errors=True)
        sys.stdout.flush()
        return ev, self.sink.take() if self.sink else ""

    def run_forked(self, code: str, context: dict[str, Any]) -> tuple[Evaluation, str]:
        workdir = self._workdir()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        nonce = secrets.token_hex(16)
        pid = os.fork()
        if pid == 0:  # the candidate process
            status = 70
            try:
                for fd in (self.req_fd, self.resp_fd, res_r, out_r):
                    os.close(fd)
                os.dup2(out_w, 1)
                os.dup2(out_w, 2)
                os.close(out_w)
                os.setpgid(0, 0)
                os.chdir(workdir)
                os.environ.update(HOME=workdir, TMPDIR=workdir)
                tempfile.tempdir = workdir
                limit_candidate_process(self.memory_mb, self.timeout_s)
                install_seccomp()
                ev = evaluate_guarded(self.evaluator, code, context, workdir)
                protocol.write_frame(res_w, {"nonce": nonce, "evaluation": ev.to_dict()})
                status = 0
            finally:
                _os_exit(status)
        os.close(res_w)
        os.close(out_w)
        sink = OutputSink(out_r, self.max_output)
        data = bytearray()
        while True:
            chunk = protocol._os_read(res_r, 1 << 16)
            if not chunk:
                break
            if len(data) <= protocol.MAX_FRAME + 64:
                data += chunk
        os.close(res_r)
        _, status = os.waitpid(pid, 0)
        self._kill_descendants()
        sink.thread.join(timeout=2.0)
        os.close(out_r)
        shutil.rmtree(workdir, ignore_errors=True)
        output = sink.take()
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            kind, msg = _describe_status(status)
            return Evaluation.failure(kind, msg), output
        try:
            frames = protocol.decode_frames(bytes(data))
            if len(frames) != 1 or frames[0].get("nonce") != nonce:
                raise protocol.ProtocolError(f"{len(frames)} frames or a wrong nonce")
            return protocol.validate_evaluation(frames[0]["evaluation"]), output
        except (protocol.ProtocolError, ValueError, KeyError) as exc:
            return Evaluation.failure(FailureKind.EXCEPTION,
                                      f"the program tampered with the sandbox's result channel "
                                      f"({exc})"), output

    @staticmethod
    def _kill_descendants() -> None:
        """Kill anything the candidate left behind (we are a child subreaper)."""
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break

    def serve(self) -> None:
        while True:
            req = protocol.read_frame(self.req_fd)
            if req is None or req.get("type") == "exit":
                return
            run = self.run_forked if self.fork_safe else self.run_inline
            ev, output = run(str(req["code"]), dict(req.get("context") or {}))
            protocol.write_frame(self.resp_fd, {"type": "result", "id": req["id"],
                                                "nonce": req["nonce"],
                                                "evaluation": ev.to_dict(), "output": output})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--req-fd", type=int, required=True)
    parser.add_argument("--resp-fd", type=int, required=True)
    args = parser.parse_args(argv)
    harden_worker()
    init = protocol.read_frame(args.req_fd)
    if init is None:
        return 0
    try:
        worker = Worker(args.req_fd, args.resp_fd, init)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent verbatim
        protocol.write_frame(args.resp_fd, {
            "type": "error", "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:]})
        return 2
    worker.prepare()
    protocol.write_frame(args.resp_fd, {"type": "ready", "pid": os.getpid(),
                                        "fork_safe": worker.fork_safe})
    worker.serve()
    shutil.rmtree(worker.base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
