"""Parent side of the sandbox: scorer workers, the watchdog, and the ``Sandbox`` API.

Each slot owns one trusted scorer worker (``worker.py``), which runs every candidate in a
fresh single-use runner process (``runner.py``). While a candidate runs, the slot's thread
waits on the worker's result pipe and every ``POLL_S`` checks the wall clock and the resident
memory of the runner processes, killing them when a limit is crossed. A result outside the
task's ``score_range`` is a ``tampered`` failure, never a score. A dead worker is replaced
lazily, so one bad candidate costs at most its own limit.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import logging
import math
import os
import queue
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

import psutil

from atlas.sandbox import cgroup, protocol
from atlas.sandbox.inputs import evaluation_key
from atlas.sandbox.isolation import (
    BWRAP,
    CORES_GAP,
    bwrap_args,
    core_sets,
    find_bwrap,
    isolation_gaps,
    resolve_isolation,
    runner_identity,
    sandbox_env,
)
from atlas.sandbox.namespaces import INODE_BYTES, SCRATCH_SOURCE, host_root
from atlas.sandbox.seccomp import check_extra_syscalls
from atlas.sandbox.secret import check_secret
from atlas.sandbox.settings import Confinement, Resources, TaskSpec
from atlas.sandbox.view import code_view, hidden_roots, need_modules, readable_roots
from atlas.types import Evaluation, FailureKind

log = logging.getLogger("atlas.sandbox")

POLL_S = 0.05
RSS_EVERY_S = 0.1
GRACE_S = 3.0  # after killing a forked candidate, how long the worker has to report it
STARTUP_TIMEOUT_S = 180.0
_WORKER_MODULE = "atlas.sandbox.worker"


#: the watchdog's thread cap per runner, where ``RLIMIT_NPROC`` cannot be had (no uid or
#: user namespace of the runner's own); the runner's own cap is ``isolation.MAX_TASKS`` more
#: than it held before the candidate
MAX_WATCHED_THREADS = 1024


class Unmeasurable(RuntimeError):
    """The watchdog cannot count a runner's memory: the runner hid its scratch from it."""


def _in_own_pid_namespace(pid: int) -> bool:
    """Whether live process ``pid`` is a runner (pid 1 of a pid namespace below ours): what
    runs a candidate; not the short-lived process that took the namespaces and forked it,
    which shares the runner's mounts but is not dumpable."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            line = next((x for x in fh if x.startswith("NSpid:")), "")
    except OSError:
        return False
    ids = line.split()[1:]  # its pid in each namespace, ours first, its own last
    return len(ids) > 1 and ids[-1] == "1"


def _scratch_bytes(pid: int) -> int:
    """Bytes in the private scratch tmpfs of runner ``pid``, with what its inodes cost the
    kernel (0 if it has none). ``Unmeasurable`` where its scratch exists but cannot be read
    while the runner lives (a runner that made itself not dumpable keeps /proc/<pid>/root
    from a watchdog of its uid): memory that cannot be counted is not let pass."""
    try:
        with open(f"/proc/{pid}/mountinfo") as fh:
            points = [line.split()[4] for line in fh if f" {SCRATCH_SOURCE} " in line]
    except OSError:
        return 0
    total = 0
    for point in points:
        try:
            st = os.statvfs(f"/proc/{pid}/root{point}")
        except PermissionError as exc:
            if _in_own_pid_namespace(pid):
                raise Unmeasurable(f"its scratch {point} is unreadable to the watchdog "
                                   f"({exc.strerror})") from None
            continue  # the process that forked the runner, on its way out: not dumpable

        except OSError:
            continue
        total += (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * INODE_BYTES
    return total


def _process_usage(pid: int) -> tuple[int, int]:
    """(resident bytes plus page tables, threads) of process ``pid``: page tables are memory
    the kernel holds for it that no resident count shows (a sparse mapping read page by page
    costs a page table per 2 MB and no resident page)."""
    used, threads = 0, 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key = line[:7]
            if key in ("VmRSS:\t", "VmPTE:\t"):
                used += int(line.split()[1]) << 10
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return used, threads


class SandboxError(RuntimeError):
    """The sandbox itself cannot work (bad evaluator factory, worker start-up failure)."""


def _kill_tree(root: psutil.Process | None, keep_root: bool = False) -> None:
    if root is None:
        return
    try:
        procs = root.children(recursive=True)
    except psutil.Error:
        procs = []
    if not keep_root:
        procs.append(root)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def thread_limits(threads: int) -> dict[str, str]:
    """Environment that caps a worker's BLAS/OpenMP/XLA thread pools.

    Parallelism comes from the number of workers; a worker that also spawned one thread per
    core would oversubscribe the machine while the agent generates (OpenMP threads then
    spin-wait on each other and everything slows down many times over).
    """
    n = str(threads)
    xla = os.environ.get("XLA_FLAGS", "")
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in xla:
        xla = (xla + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "XLA_FLAGS": xla}


class _Slot:
    """One worker process and the pipes to it; used by one thread at a time."""

    def __init__(self, sandbox: Sandbox, index: int) -> None:
        self.sb, self.index = sandbox, index
        self.proc: subprocess.Popen[bytes] | None = None
        self.root: psutil.Process | None = None
        self.worker: psutil.Process | None = None
        self.req_w = self.resp_r = -1
        self.served = 0
        self.tmp_root: str | None = None
        self._ids = itertools.count()

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        sb = self.sb
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        cmd = [sys.executable, "-m", _WORKER_MODULE, "--req-fd", str(req_r),
               "--resp-fd", str(resp_w)]
        if sb.fork_safe:  # the zygote imports the runner's module once, before any fork
            cmd += ["--preload", sb.runner_factory.split(":")[0]]
        if sb.cores:  # bound before the zygote forks: every runner inherits the set
            cmd += ["--cores", ",".join(map(str, sb.cores[self.index]))]
        env = sandbox_env(thread_limits(sb.threads_per_worker))
        group = self.cgroup_dir()
        if sb.isolation == BWRAP:
            cmd = bwrap_args(str(find_bwrap()), sb.memory_mb, sb.hide, sb.view, group) + cmd
        else:
            self.tmp_root = tempfile.mkdtemp(prefix="atlas-sandbox-")
            if host_root():  # its runners' fresh uids reach code below a private folder
                cmd += ["--view", json.dumps({"readable": list(sb.view.readable),
                                              "masks": list(sb.view.masks)})]
        errlog = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL,
                                         stdout=errlog, stderr=errlog, env=env,
                                         start_new_session=True)
        finally:
            os.close(req_r)
            os.close(resp_w)
        self.root = psutil.Process(self.proc.pid)
        protocol.write_frame(self.req_w, {
            "type": "init", "factory": sb.evaluator_factory, "config": sb.evaluator_config,
            "memory_mb": sb.memory_mb, "timeout_s": sb.timeout_s,
            "max_output_bytes": sb.max_output_bytes, "tmp_root": self.tmp_root,
            "runner_factory": sb.runner_factory, "secret": sb.secret, "hide": sb.hide,
            "readable": readable_roots(sb.view), "listable": list(sb.view.listable),
            "cgroup": group and {"dir": group, "version": sb.cgroup.version},
            "syscalls": list(sb.syscalls), "audit": sb.audit})
        reply = self._await_frame(time.monotonic() + STARTUP_TIMEOUT_S)
        if reply is None or reply.get("type") != "ready":
            errlog.seek(0)
            stderr = errlog.read()[-3000:].decode("utf-8", "replace")
            detail = (reply or {}).get("traceback") or (reply or {}).get("message") or stderr
            self.stop()
            raise SandboxError(f"sandbox worker failed to start evaluator_factory="
                               f"{sb.evaluator_factory!r}:\n{detail}")
        errlog.close()
        self.worker = self._find_worker()
        self.served = 0
        log.debug("sandbox worker %d started (pid %s)", self.index, self.proc.pid)

    def _find_worker(self) -> psutil.Process | None:
        """The worker's host process (under bwrap the root is bwrap itself)."""
        level = [self.root] if self.root else []
        while level:
            nxt = []
            for p in level:
                try:
                    cmdline = p.cmdline()
                    if _WORKER_MODULE in cmdline and "bwrap" not in os.path.basename(cmdline[0]):
                        return p
                    nxt.extend(p.children())
                except psutil.Error:
                    continue
            level = nxt
        return self.root

    def cgroup_dir(self) -> str | None:
        """This slot's directory of runner cgroups (None where none could be made)."""
        return os.path.join(self.sb.cgroup.path, f"s{self.index}") if self.sb.cgroup else None

    def stop(self) -> None:
        _kill_tree(self.root)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("sandbox worker %d did not die after SIGKILL", self.index)
        group = self.cgroup_dir()
        for name in os.listdir(group) if group and os.path.isdir(group) else ():
            cgroup.remove_tree(os.path.join(group, name))  # what a killed worker left
        for fd in (self.req_w, self.resp_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.resp_r = -1
        self.proc = self.root = self.worker = None
        if self.tmp_root:
            shutil.rmtree(self.tmp_root, ignore_errors=True)
            self.tmp_root = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- I/O --------------------------------------------------------------------------------
    def _await_frame(self, deadline: float) -> dict[str, Any] | None:
        buf = protocol.FrameBuffer()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.resp_r], [], [], POLL_S)
            if ready:
                chunk = os.read(self.resp_r, 1 << 16)
                if not chunk:
                    return None
                buf.feed(chunk)
                frame = buf.pop()
                if frame is not None:
                    return frame
            elif not self.alive():
                return None
        return None

    def _candidate_procs(self) -> list[psutil.Process]:
        """The runners: every process below the worker's zygote (its grandchildren)."""
        if self.worker is None:
            return []
        procs: list[psutil.Process] = []
        try:
            for zygote in self.worker.children():
                procs.extend(zygote.children(recursive=True))
        except psutil.Error:
            pass
        return procs

    def _usage(self) -> tuple[float, int]:
        """(MB, most threads of one runner) of the runners: resident memory (anonymous and
        mapped shared memory alike) and page tables, plus what each runner's private scratch
        tmpfs holds and its inodes cost, which no RSS shows. Unmapped memfd memory needs no
        count: seccomp refuses ``memfd_create``, SysV shared memory and pipes too."""
        total, threads = 0, 0
        for p in self._candidate_procs():
            try:
                used, count = _process_usage(p.pid)
                total += used + _scratch_bytes(p.pid)
                threads = max(threads, count)
            except (OSError, ValueError):
                pass
        return total / (1 << 20), threads

    # -- one candidate ----------------------------------------------------------------------
    def run(self, code: str, context: dict[str, Any]) -> Evaluation:
        sb = self.sb
        if not self.alive():
            self.stop()
            self.start()
        nonce, rid = secrets.token_hex(16), next(self._ids)
        start = time.monotonic()
        protocol.write_frame(self.req_w, {"type": "eval", "id": rid, "nonce": nonce,
                                          "code": code, "context": context})
        deadline = start + sb.timeout_s
        buf, frame, verdict = protocol.FrameBuffer(), None, None
        give_up, next_rss, peak = math.inf, start, 0.0
        try:
            while frame is None:
                now = time.monotonic()
                if now >= give_up:
                    break
                if verdict is None and now >= deadline:
                    verdict = Evaluation.failure(
                        FailureKind.TIMEOUT, f"the program exceeded the {sb.timeout_s:g} s "
                                             f"wall-time limit and was killed")
                elif verdict is None and now >= next_rss:
                    next_rss = now + RSS_EVERY_S
                    try:
                        used, threads = self._usage()
                    except Unmeasurable as exc:
                        used, threads, hidden = 0.0, 0, str(exc)
                    else:
                        hidden = ""
                    peak = max(peak, used)
                    if hidden:
                        verdict = Evaluation.failure(
                            FailureKind.KILLED, f"the program hid its memory from the sandbox's "
                                                f"watchdog ({hidden}) and was killed: memory "
                                                f"that cannot be counted against the limit of "
                                                f"{sb.memory_mb} MB is not allowed")
                    elif peak > sb.memory_mb:
                        verdict = Evaluation.failure(
                            FailureKind.KILLED, f"the program exceeded the memory limit of "
                                                f"{sb.memory_mb} MB (resident and scratch "
                                                f"{peak:.0f} MB) and was killed")
                    elif threads > MAX_WATCHED_THREADS:
                        verdict = Evaluation.failure(
                            FailureKind.KILLED, f"the program started more than "
                                                f"{MAX_WATCHED_THREADS} threads and was killed")
                if verdict is not None and give_up == math.inf:
                    for proc in self._candidate_procs():
                        _kill_tree(proc)
                    give_up = time.monotonic() + GRACE_S
                ready, _, _ = select.select([self.resp_r], [], [], POLL_S)
                if ready:
                    chunk = os.read(self.resp_r, 1 << 16)
                    if not chunk:
                        break
                    buf.feed(chunk)
                    frame = buf.pop()
                elif not self.alive():
                    break
            ev = self._interpret(frame, rid, nonce, verdict)
        except (protocol.ProtocolError, ValueError) as exc:
            ev = Evaluation.failure(FailureKind.TAMPERED,
                                    f"the program tampered with the sandbox protocol ({exc})")
            frame = None
        if ev.passed and not sb.score_ok(ev.score):
            ev = Evaluation.failure(FailureKind.TAMPERED,
                                    f"score {ev.score!r} lies outside the task's possible range "
                                    f"{list(sb.score_range)}; no genuine program scores that",
                                    metrics=ev.metrics)
        missing = [m for m in sb.quality_metrics if m not in ev.metrics] if ev.passed else []
        if missing:  # the scorer forgot what the task declares: the task's bug
            ev = Evaluation.failure(FailureKind.TASK_ERROR,
                                    f"the task's scorer passed the program without the declared "
                                    f"quality metric(s) {missing} in Evaluation.metrics (it "
                                    f"reported {sorted(ev.metrics)[:12]}); report them, or "
                                    f"remove them from the task's quality_metrics",
                                    metrics=ev.metrics)
        ev.seconds = time.monotonic() - start
        self.served += 1
        healthy = frame is not None and buf.pending() == 0 and self.alive()
        if not healthy or self.served >= sb.recycle_every:
            self.stop()
        return ev

    def _interpret(self, frame: dict[str, Any] | None, rid: int, nonce: str,
                   verdict: Evaluation | None) -> Evaluation:
        if verdict is not None:
            return verdict
        if frame is None:
            code = self.proc.poll() if self.proc else None
            return Evaluation.failure(FailureKind.KILLED,
                                      f"the sandbox worker died while running the program "
                                      f"(exit status {code}); it was probably killed")
        if frame.get("type") != "result" or frame.get("id") != rid or frame.get("nonce") != nonce:
            raise protocol.ProtocolError("a result frame with the wrong id or nonce")
        return protocol.validate_evaluation(frame.get("evaluation"))


def _copy_of(future: concurrent.futures.Future[Evaluation]
             ) -> concurrent.futures.Future[Evaluation]:
    """A future of a copy of ``future``'s evaluation, so no caller's change reaches another."""
    out: concurrent.futures.Future[Evaluation] = concurrent.futures.Future()

    def done(f: concurrent.futures.Future[Evaluation]) -> None:
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())
        else:
            ev = f.result()
            out.set_result(dataclasses.replace(ev, metrics=dict(ev.metrics)))

    future.add_done_callback(done)
    return out


class Sandbox:
    """Runs untrusted candidate programs in isolated single-use processes, in parallel.

    ``task`` (a ``TaskSpec``) names the trusted scorer, built once per worker from
    ``evaluator_factory`` with ``evaluator_config`` (and ``secret=`` if it takes one), and the
    runner built in each candidate's single-use process; it sets each candidate's wall time and
    what a genuine result is. ``resources`` (workers, threads, memory, output) and
    ``confinement`` (isolation, hidden paths, audit) default to a plain two-worker sandbox.
    ``secret`` (the run's, 64 hex characters, see ``secret.py``) defaults to a fresh one.
    """

    def __init__(self, task: TaskSpec, *, resources: Resources | None = None,
                 confinement: Confinement | None = None, secret: str | None = None) -> None:
        resources, confinement = resources or Resources(), confinement or Confinement()
        evaluator_factory, evaluator_config = task.evaluator_factory, task.evaluator_config
        runner_factory, timeout_s, score_range = task.runner_factory, task.timeout_s, task.score_range
        quality_metrics, fork_safe, syscalls = task.quality_metrics, task.fork_safe, task.syscalls
        workers, threads_per_worker = resources.workers, resources.threads_per_worker
        memory_mb, max_output_bytes = resources.memory_mb, resources.max_output_bytes
        recycle_every = resources.recycle_every
        isolation, hide, audit = confinement.isolation, list(confinement.hide), confinement.audit
        #: program key and regime -> the future of its one evaluation (``score_once``)
        self._scored: dict[str, concurrent.futures.Future[Evaluation]] | None = (
            {} if confinement.score_once and not confinement.audit else None)
        if not isinstance(evaluator_factory, str) or evaluator_factory.count(":") != 1 \
                or not all(evaluator_factory.split(":")):
            raise ValueError(f"evaluator_factory={evaluator_factory!r} is invalid: use an import "
                             f"path 'package.module:function'")
        if not isinstance(evaluator_config, dict):
            raise ValueError(f"evaluator_config must be a dict, got "
                             f"{type(evaluator_config).__name__}")
        try:
            json.dumps(evaluator_config)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"evaluator_config must hold plain JSON values: {exc}") from exc
        for name, value, low in (("workers", workers, 1), ("memory_mb", memory_mb, 64),
                                 ("max_output_bytes", max_output_bytes, 0),
                                 ("recycle_every", recycle_every, 1),
                                 ("threads_per_worker", threads_per_worker, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"sandbox {name}={value!r} is invalid: use an integer >= {low}")
        if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"sandbox timeout_s={timeout_s!r} is invalid: use seconds > 0")
        self.evaluator_factory = evaluator_factory
        self.evaluator_config = dict(evaluator_config)
        self.workers, self.timeout_s, self.memory_mb = workers, float(timeout_s), memory_mb
        self.max_output_bytes, self.recycle_every = max_output_bytes, recycle_every
        self.threads_per_worker = threads_per_worker
        if runner_factory is None:
            raise ValueError("runner_factory is missing: every task needs a runner, the "
                             "untrusted half that calls the program (Task.runner_factory, e.g. "
                             "'mypkg.scoring:make_runner'); see docs/tasks.md")
        if not isinstance(runner_factory, str) or runner_factory.count(":") != 1 \
                or not all(runner_factory.split(":")):
            raise ValueError(f"runner_factory={runner_factory!r} is invalid: use an import "
                             f"path 'package.module:function'")
        lo, hi = (float(v) for v in score_range)
        if not lo <= hi:
            raise ValueError(f"score_range={score_range!r} is invalid: use (low, high), low <= high")
        self.runner_factory, self.score_range, self.fork_safe = runner_factory, (lo, hi), fork_safe
        if secret is not None:
            check_secret(secret, "Sandbox(secret=...)")
        self.secret = secret if secret is not None else secrets.token_hex(32)
        #: system calls the runner may make beyond ``seccomp.ALLOWED`` (the task's)
        self.syscalls = check_extra_syscalls(syscalls, "Task.syscalls")
        #: report every system call a runner makes as ``syscall:<name>`` metrics, allowing
        #: all (``python -m atlas.sandbox audit``); never for scoring
        self.audit = bool(audit)
        #: metrics every passed evaluation must report (the task's declared quality metrics)
        self.quality_metrics = tuple(quality_metrics)
        # absolute: the runner's guard resolves them after it chdirs into its workdir, so a
        # relative path (sandbox.secret_file=docs/...) would mask the wrong file
        #: paths masked inside bubblewrap (the run folder holding the secret, the secret file)
        #: widened to whole output trees (``hidden_roots``): siblings' secrets and records too
        need_modules(evaluator_factory, runner_factory)  # the launch directory may hold them
        self.hide = hidden_roots([os.path.abspath(p) for p in (hide or [])])
        #: what a worker and its runners may read: the task's code, the libraries it imports
        self.view = code_view((evaluator_factory, runner_factory))
        #: what is really active ("bwrap" or "rlimits+guard") and, if degraded, why
        self.isolation, self.isolation_reason = resolve_isolation(isolation)
        #: where each runner's memory cgroup is made (None: none can be made here, why)
        self.cgroup, no_cgroup = cgroup.make_base(workers)
        #: what this environment's runners lack, each with what it leaves open
        self.isolation_gaps = isolation_gaps(self.isolation, None if self.cgroup else no_cgroup)
        #: the cores each worker's runners are bound to (None: they share the machine's)
        self.cores, no_cores = core_sets(workers, threads_per_worker)
        if no_cores is not None:
            self.isolation_gaps.append(CORES_GAP.format(why=no_cores))
        #: the isolation line: the mode, the runners' uid, what bounds memory, what is missing
        self.isolation_line = (
            f"sandbox isolation {self.isolation}: runners run as "
            f"{runner_identity(self.isolation)}; memory: "
            f"{self.cgroup.describe() if self.cgroup else 'watchdog, scratch inode limit, RLIMIT_NOFILE, no pipes'}"
            f"; cores: {' | '.join(','.join(map(str, c)) for c in self.cores) if self.cores else 'shared'}"
            f"; lacks: {'; '.join(self.isolation_gaps) or 'nothing'}")
        log.log(logging.WARNING if self.isolation_gaps else logging.INFO, "%s",
                self.isolation_line)
        self._slots: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._all = [_Slot(self, i) for i in range(workers)]
        for slot in self._all:
            self._slots.put(slot)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "atlas-sandbox")
        self._closed = False
        self._lock = threading.Lock()
        self._busy = 0  # workers scoring a candidate right now (for the agent's thread budget)
        self._finalizer = weakref.finalize(self, Sandbox._shutdown, self._pool, self._all,
                                           self.cgroup)

    @classmethod
    def for_task(cls, task: Any, *, resources: Resources | None = None,
                 confinement: Confinement | None = None, secret: str | None = None) -> Sandbox:
        """The sandbox a ``Task`` declares (``TaskSpec.of``), on these resources."""
        return cls(TaskSpec.of(task), resources=resources, confinement=confinement, secret=secret)

    def score_ok(self, score: float) -> bool:
        """Whether a passed score could be genuine (finite and inside ``score_range``)."""
        lo, hi = self.score_range
        return math.isfinite(score) and lo <= score <= hi

    def _run(self, code: str, context: dict) -> Evaluation:
        slot = self._slots.get()
        with self._lock:
            self._busy += 1
        try:
            return slot.run(code, context)
        finally:
            with self._lock:
                self._busy -= 1
            self._slots.put(slot)

    @property
    def busy_workers(self) -> int:
        """Workers scoring a candidate at this moment (each uses one core)."""
        return self._busy

    def submit(self, code: str, context: dict) -> concurrent.futures.Future[Evaluation]:
        """Queue one candidate; the future holds its ``Evaluation``."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        json.dumps(context)  # fail here, not in the worker, on a non-JSON context
        with self._lock:
            if self._closed:
                raise RuntimeError("the Sandbox is closed")
            if self._scored is None:
                return self._pool.submit(self._run, code, dict(context))
            key = evaluation_key(code, context)
            first = self._scored.get(key)
            fresh = first is None
            if first is None:
                first = self._scored[key] = self._pool.submit(self._run, code, dict(context))
        if fresh:  # outside the lock: a callback of a future already done runs right here
            first.add_done_callback(lambda f, key=key: self._forget_if_not_its_own(key, f))
        return _copy_of(first)

    def _forget_if_not_its_own(self, key: str, future: concurrent.futures.Future[Evaluation]
                               ) -> None:
        """Run again later what did not end as the program's own result: the task's bug
        (``task_error``) or the sandbox's own failure (an exception)."""
        failed = future.cancelled() or future.exception() is not None
        if failed or future.result().failure_kind == FailureKind.TASK_ERROR:
            with self._lock:
                if self._scored is not None and self._scored.get(key) is future:
                    del self._scored[key]

    def evaluate(self, code: str, context: dict) -> Evaluation:
        """Run one candidate and wait for its ``Evaluation``."""
        return self.submit(code, context).result()

    def evaluate_many(self, codes: list[str], context: dict) -> list[Evaluation]:
        """Run candidates in parallel across workers; results in input order."""
        futures = [self.submit(code, context) for code in codes]
        return [f.result() for f in futures]

    @staticmethod
    def _shutdown(pool: concurrent.futures.ThreadPoolExecutor, slots: list[_Slot],
                  base: cgroup.Base | None) -> None:
        pool.shutdown(wait=True, cancel_futures=True)
        for slot in slots:
            slot.stop()
        if base is not None:
            cgroup.remove_tree(base.path)

    def close(self) -> None:
        """Stop all workers (waits for running candidates, at most their limits)."""
        with self._lock:
            self._closed = True
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
