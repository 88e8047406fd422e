"""The sandbox against a corpus of hostile programs (tests/hostile/, one program per file).

Each file's first line says ``# expect: <failure_kind>``. Every program is run in three
sandboxes: bubblewrap, bubblewrap with a runner module the zygote may not preload
(``fork_safe=False``, as JAX tasks use) and the rlimits+guard fallback; every candidate runs
in a fresh single-use runner process. We assert the classification, that the time taken is
bounded by the limit, that no file outside the candidate's directory appears, and that
the pool still scores a good program correctly afterwards.
"""

from __future__ import annotations

import logging
import math
import os
import pathlib
import pwd
import time

import pytest

from atlas.sandbox import Confinement, Resources, Sandbox, SandboxError, TaskSpec, isolation
from atlas.sandbox.protocol import ProtocolError, decode_frames, encode, validate_evaluation
from atlas.sandbox.seccomp import build_filter
from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER, toy_in_process
from atlas.types import Evaluation

REPO = pathlib.Path(__file__).resolve().parents[1]
HOSTILE = sorted([*(REPO / "tests" / "hostile").glob("*.py"),
                  REPO / "tests" / "hostile" / "syntax_error.txt"])  # .txt: keeps ruff clean
TIMEOUT_S = 2.0
MEMORY_MB = 300  # small, so that memory hogs hit it well within TIMEOUT_S
SLACK_S = 1.5  # poll interval + kill + the worker reporting back, on a loaded 2-core box
GOOD = ("import numpy as np\n\ndef policy(contexts, history, t, state):\n"
        "    return int(np.argmax(contexts.sum(axis=1)))\n")
BWRAP_OK = isolation.probe_bwrap()[0]


def _source(path: pathlib.Path) -> str:
    return path.read_text().replace("REPO_DIR", str(REPO))


def _expected(path: pathlib.Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks an '# expect: kind' line"
    return first.split(":", 1)[1].strip()


def _escapes() -> set[str]:
    """Files the hostile programs try to create outside their directory."""
    roots = [pathlib.Path("/tmp"), pathlib.Path(pwd.getpwuid(0).pw_dir), REPO,
             pathlib.Path.home()]
    return {str(p) for root in roots if root.is_dir() for p in root.glob("*atlas_hostile*")}


def _direct_score(config: dict) -> float:
    return toy_in_process(config, {}, GOOD).score


def toy(config: dict, *, timeout_s: float = 30.0, fork_safe: bool = True,
        syscalls: tuple[str, ...] = (), isolation: str = "auto", **resources: int) -> Sandbox:
    """A sandbox of the toy task (atlas/sandbox/testing.py) that runs a program again each
    time it is given (these tests run the same program on purpose)."""
    return Sandbox(TaskSpec(TOY_SCORER, config, TOY_RUNNER, timeout_s=timeout_s,
                            fork_safe=fork_safe, syscalls=syscalls),
                   resources=Resources(**resources),
                   confinement=Confinement(isolation=isolation, score_once=False))


@pytest.fixture(scope="module", params=["bwrap-fork", "bwrap-inline", "fallback-fork"])
def sandbox(request):
    name = request.param
    if name.startswith("bwrap") and not BWRAP_OK:
        pytest.skip("bubblewrap does not work here")
    sb = toy({"steps": 20}, workers=2, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB,
                 isolation="bwrap" if name.startswith("bwrap") else "rlimits",
                 fork_safe=not name.endswith("inline"))
    sb.label = name
    yield sb
    sb.close()


def test_hostile_corpus(sandbox):
    assert not _escapes(), f"stale files from an earlier run: {_escapes()}"
    results = {}
    for path in HOSTILE:
        start = time.monotonic()
        ev = sandbox.evaluate(_source(path), {})
        elapsed = time.monotonic() - start
        results[path.name] = (ev.failure_kind, round(elapsed, 2), ev.message[:120])
        assert ev.failure_kind == _expected(path), (path.name, ev)
        assert elapsed <= TIMEOUT_S + SLACK_S + 1.0, (path.name, elapsed)  # +1: worker restart
        assert ev.passed == (ev.failure_kind == "ok")
        assert ev.score < 1e6, f"{path.name} faked a score: {ev}"
        if ev.failure_kind == "timeout":
            assert elapsed >= TIMEOUT_S
    assert not _escapes(), f"a program wrote outside its directory: {_escapes()}"
    # the pool still works and scores exactly as the evaluator does in-process
    good = sandbox.evaluate(GOOD, {})
    assert good.passed and math.isclose(good.score, _direct_score({"steps": 20}))
    logging.getLogger(__name__).info("%s: %s", sandbox.label, results)


def test_messages_are_clear(sandbox):
    by_name = {p.name: p for p in HOSTILE}
    ev = sandbox.evaluate(_source(by_name["os_system.py"]), {})
    assert "os.system is blocked in the sandbox" in ev.message
    ev = sandbox.evaluate(_source(by_name["write_tmp.py"]), {})
    assert "may only write inside its working directory" in ev.message
    ev = sandbox.evaluate(_source(by_name["sys_exit.py"]), {})
    assert "sys.exit(0)" in ev.message
    ev = sandbox.evaluate(_source(by_name["infinite_loop.py"]), {})
    assert f"{TIMEOUT_S:g} s wall-time limit" in ev.message
    ev = sandbox.evaluate(_source(by_name["memory_hog.py"]), {})
    assert "memory" in ev.message


#: an honest program that needs its module to be a real one: a dataclass (with and without
#: the candidate's own postponed annotations), typing's get_type_hints, an enum, copies
DATACLASS_PROGRAM = """{future}import copy
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, get_type_hints

import numpy as np


class Pick(Enum):
    BEST = 1


class Score(NamedTuple):
    arm: int
    value: float


@dataclass
class Memory:
    steps: int = 0
    seen: list[int] = field(default_factory=list)


def policy(contexts, history, t, state):
    memory = state.setdefault("m", Memory())
    memory.steps += 1
    assert get_type_hints(Memory)["steps"] is int
    assert copy.deepcopy(Pick.BEST) is Pick.BEST and copy.deepcopy(memory).steps == memory.steps
    best = Score(int(np.argmax(contexts.sum(axis=1))), 0.0)
    memory.seen.append(best.arm)
    return best.arm if Pick.BEST.value == 1 else 0
"""


@pytest.mark.parametrize("future", ["", "from __future__ import annotations\n"])
def test_honest_programs_with_dataclasses_typing_and_enum_run(sandbox, future):
    """A candidate's module is a real module (in ``sys.modules``) compiled with its own future
    flags: dataclasses, typing and enums work in every mode, and score what GOOD scores (the
    same arm each step). Without the candidate's own future import, its annotations are
    objects, not the loader's postponed strings."""
    code = DATACLASS_PROGRAM.format(future=future)
    assert toy_in_process({"steps": 20}, {}, code).score == _direct_score({"steps": 20})
    ev = sandbox.evaluate(code, {})
    assert ev.passed, ev.message
    assert math.isclose(ev.score, _direct_score({"steps": 20}))


def test_a_candidate_compiles_with_its_own_future_flags_only():
    """The loader's ``from __future__ import annotations`` does not reach the candidate."""
    from atlas.sandbox.candidate import load_candidate

    plain = load_candidate("def f(x: int) -> int:\n    return x\n", "f")
    assert plain.__annotations__ == {"x": int, "return": int}
    postponed = load_candidate("from __future__ import annotations\n"
                               "def f(x: int) -> int:\n    return x\n", "f")
    assert postponed.__annotations__ == {"x": "int", "return": "int"}
    assert plain.__module__ == "candidate"


def test_scorer_worker_stays_warm_and_candidates_are_isolated():
    with toy({"steps": 20}, workers=1, timeout_s=TIMEOUT_S,
                 memory_mb=MEMORY_MB) as sb:
        assert sb.evaluate(GOOD, {}).passed
        slot = sb._all[0]
        pid = slot.proc.pid
        tamper = _source(REPO / "tests" / "hostile" / "tamper_scorer.py")
        for code in (tamper, _source(REPO / "tests" / "hostile" / "infinite_loop.py"), GOOD):
            sb.evaluate(code, {})
        assert slot.proc.pid == pid, "a timeout or a bad candidate restarted the warm worker"
        after = sb.evaluate(GOOD, {})
        assert after.score == pytest.approx(_direct_score({"steps": 20}))  # patch did not leak
        # the native fork bomb left nothing running behind it
        ev = sb.evaluate(_source(REPO / "tests" / "hostile" / "fork_bomb_native.py"), {})
        assert ev.failure_kind == "blocked" and "clone" in ev.message, ev
        # left behind: the zygote and the one spare runner it forks for the next candidate
        # (forked asynchronously: on a loaded machine it may not be up yet, so wait for it).
        # The runner is forked through an intermediate that exits once it has reported the
        # runner's pid (``isolation.own_process_tree``); on a loaded machine it can be seen
        # beside its runner for a moment (and, read one process at a time, even beside the
        # runner already handed to the zygote). So at most two processes at any time, and
        # once settled the runner alone.
        zygotes = slot.worker.children()
        assert len(zygotes) == 1
        deadline = time.monotonic() + 20
        while True:
            left = _live_parents(zygotes[0])
            assert len(left) <= 2, left
            if len(left) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(left) == 1, f"the zygote forked no spare runner, or more than one: {left}"


def _live_parents(zygote) -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process under ``zygote``."""
    import psutil

    out = {}
    for proc in zygote.children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out[proc.pid] = proc.ppid()
        except psutil.NoSuchProcess:
            pass
    return out


def test_every_candidate_gets_a_fresh_runner_process():
    """A mark left in the interpreter reaches no later candidate, and every runner is pid 1
    of its own pid namespace: its pid says nothing about the runners before it."""
    mark = ("import builtins, os\n\ndef policy(contexts, history, t, state):\n"
            "    n = getattr(builtins, 'atlas_mark', 0)\n    builtins.atlas_mark = n + 1\n"
            "    raise ValueError((n, os.getpid()))\n")
    with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation="rlimits") as sb:
        seen = {sb.evaluate(mark, {}).message for _ in range(3)}
    assert seen == {"ValueError (line 6): (0, 1)"}, seen


def test_workdir_is_cwd_and_home_and_is_removed():
    code = ("import os\n\ndef policy(contexts, history, t, state):\n"
            "    assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR']\n"
            "    open('left_behind.txt', 'w').write('x')\n    return 0\n")
    with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation="rlimits") as sb:
        assert sb.evaluate(code, {}).passed
        root = sb._all[0].tmp_root
        left = [p for p in pathlib.Path(root).iterdir()]
        # the scorer's own directory, and the empty directory of the spare runner waiting
        # for the next candidate (its own tmpfs is mounted there in its namespace only)
        spare = [p for p in left if p.name.startswith("cand-")]
        assert len(spare) <= 1 and not any(any(p.iterdir()) for p in spare), left
        assert all(p.name.startswith(("atlas-scorer-", "cand-")) for p in left), left
    assert not os.path.exists(root)


def _private_scratch_works() -> bool:
    """Whether this host lets a runner take a mount namespace and its own scratch."""
    return "scratch" in isolation.runner_features(isolation.FALLBACK)


@pytest.mark.parametrize("mode", ["rlimits", pytest.param("bwrap", marks=pytest.mark.skipif(
    not BWRAP_OK, reason="bubblewrap unusable here"))])
def test_each_candidate_gets_its_own_fresh_tmpfs(mode):
    """The working directory is a tmpfs mounted in the runner's own mount namespace: each
    candidate finds an empty filesystem of its own there, gone with its runner."""
    if not _private_scratch_works():
        pytest.skip("no mount namespace for unprivileged processes here")
    code = ("import os\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n"
            "        here = os.path.realpath(os.getcwd())\n"
            "        mine = [l.split() for l in open('/proc/self/mountinfo') if l.split()[4] == here]\n"
            "        left = os.listdir('.')\n"
            "        open('left_by_the_last', 'w').write('x')\n"
            "        raise RuntimeError(repr((left, [m[-3] for m in mine])))\n"
            "    return 0\n")
    with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation=mode) as sb:
        seen = [eval(sb.evaluate(code, {}).message.split(": ", 1)[1]) for _ in range(2)]
    assert seen == [([], ["tmpfs"]), ([], ["tmpfs"])], seen


def test_parallel_across_workers():
    """Four programs that sleep 2 s each on two workers end in about 4 s; one after another
    they would take 8 s, so the 4 s margin is for start-up on a loaded machine."""
    code = ("import time\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n        time.sleep(2.0)\n    return 0\n")
    with toy({}, workers=2, timeout_s=10.0) as sb:
        sb.evaluate_many([GOOD, GOOD], {})  # start both workers
        start = time.monotonic()
        results = sb.evaluate_many([code] * 4, {})
        elapsed = time.monotonic() - start
    assert all(r.passed for r in results)
    assert elapsed < 4 * 2.0, f"4 x 2 s on 2 workers took {elapsed:.2f} s (not parallel)"


def test_jax_works_in_a_runner_under_the_memory_limit():
    pytest.importorskip("jax")
    code = ("import jax.numpy as jnp\n\ndef policy(contexts, history, t, state):\n"
            "    return int(jnp.ones(3).sum()) - 3\n")
    with toy({"jax": True, "steps": 3}, workers=1, fork_safe=False,
                 timeout_s=60, memory_mb=2048) as sb:
        ev = sb.evaluate(code, {})
    assert ev.passed, ev


def test_isolation_choices(monkeypatch, caplog):
    monkeypatch.setattr(isolation, "find_bwrap", lambda: None)
    isolation.probe_bwrap.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
            toy({}, isolation="bwrap")
        with caplog.at_level(logging.WARNING, logger="atlas.sandbox"):
            sb = toy({}, isolation="auto", workers=1, timeout_s=TIMEOUT_S)
        assert sb.isolation == "rlimits+guard"
        assert "bubblewrap is not installed" in sb.isolation_reason
        assert "bubblewrap unusable" in caplog.text
        assert sb.evaluate(GOOD, {}).passed
        sb.close()
    finally:
        monkeypatch.undo()
        isolation.probe_bwrap.cache_clear()
    if BWRAP_OK:
        assert toy({}, isolation="auto").isolation == "bwrap"
    assert toy({}, isolation="rlimits").isolation == "rlimits+guard"


@pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap does not work here")
def test_bwrap_probe_works_from_any_directory_with_a_relative_pythonpath(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", ".")
    isolation.probe_bwrap.cache_clear()
    try:
        assert isolation.probe_bwrap() == (True, "")
        monkeypatch.chdir(tmp_path)
        with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation="bwrap") as sb:
            assert sb.evaluate(GOOD, {}).passed
    finally:
        isolation.probe_bwrap.cache_clear()


def test_seccomp_allows_no_signal_to_another_process():
    from atlas.sandbox.seccomp import ALLOWED, NEVER, PID_CHECKED

    signals = {"kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
               "pidfd_send_signal", "pidfd_open"}
    assert not signals & ALLOWED
    assert signals <= NEVER | set(PID_CHECKED)


def test_seccomp_denies_metadata_changes_and_page_cache_probes(tmp_path):
    """The kernel answers, whatever Python-level guard there is: in a child that installed
    the filter, changing a file's mode, owner, timestamps or extended attributes, and asking
    the page cache about it, fail with the errno the filter names, in a thread started before
    the filter too (TSYNC); reading still works."""
    import errno
    import json
    import threading

    from atlas.sandbox.seccomp import install_seccomp

    target = tmp_path / "f"
    target.write_bytes(b"x" * 8192)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the filter is irreversible
        out: dict[str, int] = {}
        try:
            go = threading.Event()

            def older_thread() -> None:  # started before the filter (like XLA's pools)
                go.wait()
                try:
                    os.chmod(target, 0o600)
                    out["older_thread"] = 0
                except OSError as exc:
                    out["older_thread"] = exc.errno

            thread = threading.Thread(target=older_thread)
            thread.start()
            install_seccomp()
            go.set()
            thread.join()
            fd = os.open(target, os.O_RDONLY)
            for name, call in (
                    ("chmod", lambda: os.chmod(target, 0o600)),
                    ("chown", lambda: os.chown(target, os.getuid(), os.getgid())),
                    ("utime", lambda: os.utime(target, (0, 0))),
                    ("setxattr", lambda: os.setxattr(target, "user.x", b"1")),
                    ("removexattr", lambda: os.removexattr(target, "user.x")),
                    ("fadvise", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)),
                    ("preadv2", lambda: os.preadv(fd, [bytearray(8)], 0, os.RWF_NOWAIT)),
                    ("read", lambda: os.pread(fd, 8, 0))):
                try:
                    call()
                    out[name] = 0
                except OSError as exc:
                    out[name] = exc.errno
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got = json.loads(os.read(r, 4096))
    os.close(r)
    assert got == {"chmod": errno.EPERM, "chown": errno.EPERM, "utime": errno.EPERM,
                   "setxattr": errno.ENOTSUP, "removexattr": errno.ENOTSUP,
                   # ENOSYS from the filter: glibc's preadv2 then refuses the flag itself
                   "fadvise": errno.EPERM, "preadv2": errno.ENOTSUP, "read": 0,
                   "older_thread": errno.EPERM}, got


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="evaluator_factory"):
        Sandbox(TaskSpec("atlas.sandbox.testing.make_toy_scorer", {}, TOY_RUNNER))
    with pytest.raises(ValueError, match="workers"):
        toy({}, workers=0)
    with pytest.raises(ValueError, match="isolation"):
        toy({}, isolation="docker")
    with pytest.raises(ValueError, match="timeout_s"):
        toy({}, timeout_s=0)
    # every task is split: a scorer alone is refused before any worker starts
    with pytest.raises(ValueError, match=r"runner_factory is missing: every task needs a runner"
                                         r".*see docs/tasks\.md"):
        Sandbox(TaskSpec(TOY_SCORER, {}, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"runner_factory='nomodule' is invalid"):
        Sandbox(TaskSpec(TOY_SCORER, {}, "nomodule"))
    with Sandbox(TaskSpec("atlas.sandbox.testing:no_such_factory", {}, TOY_RUNNER),
                 resources=Resources(workers=1)) as sb:
        with pytest.raises(SandboxError, match="no_such_factory"):
            sb.evaluate(GOOD, {})


def test_protocol_rejects_forgeries():
    frame = encode({"a": 1})
    assert decode_frames(frame) == [{"a": 1}]
    with pytest.raises(ProtocolError):
        decode_frames(frame + b"x")
    with pytest.raises(ProtocolError):
        decode_frames(b"XXXX" + frame[4:])
    with pytest.raises(ProtocolError):
        validate_evaluation({"score": None, "passed": True, "failure_kind": "ok"})
    with pytest.raises(ProtocolError):
        validate_evaluation({"score": 1.0, "passed": True, "failure_kind": "pwned"})
    ev = validate_evaluation(Evaluation(score=-0.5, passed=True, metrics={"m": 1.0}).to_dict())
    assert ev.score == -0.5 and ev.metrics == {"m": 1.0}


def test_seccomp_filter_shape():
    for machine in ("x86_64", "aarch64"):
        prog = build_filter(machine)
        assert prog is not None and len(prog) % 8 == 0 and len(prog) // 8 < 4096
    assert build_filter("riscv64") is None


def test_real_bandit_evaluator_with_hostile_programs():
    pytest.importorskip("atlas.tasks.bandit.evaluator")
    config = {"env_seeds": [0], "T": 50}
    names = {"infinite_loop.py": "timeout", "os_system.py": "exception",
             "return_string.py": "wrong_return", "fake_score_native.py": "tampered",
             "memory_hog_single.py": "killed", "write_repo.py": "exception"}
    with Sandbox(TaskSpec("atlas.tasks.bandit.evaluator:make_scorer", config,
                          "atlas.tasks.bandit.evaluator:make_runner", timeout_s=TIMEOUT_S),
                 resources=Resources(workers=2, memory_mb=MEMORY_MB)) as sb:
        codes = [_source(REPO / "tests" / "hostile" / n) for n in names]
        for (name, kind), ev in zip(names.items(), sb.evaluate_many(codes, {})):
            assert ev.failure_kind == kind, (name, ev)
        assert sb.evaluate(GOOD, {}).passed
    assert not _escapes()


def test_busy_workers_counts_candidates_being_scored():
    """The agent's thread budget reads this: cores minus workers scoring right now."""
    from atlas.loop import agent_thread_budget, usable_cores

    code = ("import time\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n        time.sleep(1.0)\n    return 0\n")
    with toy({}, workers=2, timeout_s=TIMEOUT_S) as sb:
        budget = agent_thread_budget(None, sb)
        sb.evaluate_many([GOOD, GOOD], {})  # start both workers
        assert sb.busy_workers == 0 and budget() == usable_cores()
        fut = sb.submit(code, {})
        deadline = time.monotonic() + 2.0
        while sb.busy_workers == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sb.busy_workers == 1 and budget() == max(1, usable_cores() - 1)
        assert fut.result().passed
        assert sb.busy_workers == 0 and budget() == usable_cores()
    fixed = agent_thread_budget(3, sb)
    assert fixed() == 3


def test_sandbox_isolation_config_is_validated_by_name():
    from atlas.config import ConfigError, validate
    from tests.conftest import compose_cfg

    assert compose_cfg().sandbox.isolation == "auto"
    validate(compose_cfg(["sandbox.isolation=rlimits"]))
    with pytest.raises(ConfigError, match=r"sandbox\.isolation='docker' is not one of"):
        validate(compose_cfg(["sandbox.isolation=docker"]))


def test_end_of_run_summary_names_a_degraded_isolation():
    from atlas.train import summary

    results = {"task": "bandit", "method": "evotune", "seed": 0, "initial_score": -0.4,
               "final_score": -0.2, "improvement_pct": 50.0, "valid_rate_first_round": 1.0,
               "valid_rate_last_round": 1.0, "valid_rate": 1.0, "phases": 1,
               "phases_trained": 1, "promotions": 0, "accept_rate": 0.0, "candidates": 4,
               "wall_seconds": 1.0, "isolation": "rlimits+guard",
               "isolation_reason": "bubblewrap unusable: bubblewrap is not installed"}
    assert "sandbox isolation rlimits+guard (degraded: bubblewrap unusable" in summary(results)
    assert "degraded" not in summary({**results, "isolation": "bwrap", "isolation_reason": ""})


def test_the_summary_names_the_literal_search_where_no_llm_ran():
    """``random_literals`` loads no model: its summary names the literal search as the
    writer of its programs, which the records file under the agent's source."""
    import json

    from atlas.train import summary

    results = json.loads((REPO / "docs" / "runs" / "controls" / "bandit_random_literals_s0"
                          / "results.json").read_text())
    text = summary(results)
    assert results["model"] is None and results["candidates_by_source"]["agent"] == 64
    assert "literal search's own best -0.1987" in text, text
    assert "{'literal search': 64, 'supporter': 0, 'rescore': 0}" in text, text
    assert "agent" not in text, text
    llm = summary({**results, "model": "smollm2", "method": "sample"})
    assert "agent's own best" in llm and "{'agent': 64," in llm, llm


def test_audit_lists_the_runners_calls_and_task_syscalls_extend_the_list(capsys):
    """``python -m atlas.sandbox audit`` prints every call of the bandit runner, all allowed;
    a call off the list fails the program as ``blocked``, naming it, unless the task lists it
    in ``Task.syscalls``."""
    import re

    from atlas.commands.sandbox import main

    if os.uname().machine != "x86_64":
        pytest.skip("memfd_create's number below is x86_64's")
    assert main(["audit", "task=bandit", "sandbox.isolation=rlimits"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+read\s+\d+\s+allowed$", out, re.M), out
    assert re.search(r"^\s+write\s+\d+\s+allowed$", out, re.M), out
    memfd = ("import sys\n\ndef policy(contexts, history, t, state):\n    if t == 0:\n"
             "        libc = sys.modules['ctypes'].CDLL(None)\n"
             "        assert libc.syscall(319, b'x', 0) >= 0\n    return 0\n")
    with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation="rlimits") as sb:
        blocked = sb.evaluate(memfd, {})
    with toy({}, workers=1, timeout_s=TIMEOUT_S, isolation="rlimits",
             syscalls=("memfd_create",)) as sb:
        allowed = sb.evaluate(memfd, {})
    assert blocked.failure_kind == "blocked" and "memfd_create" in blocked.message, blocked
    assert allowed.passed, allowed


def test_workers_get_cores_of_their_own_where_there_are_enough(monkeypatch):
    """Each worker's runners get ``threads_per_worker`` cores no other worker has; with more
    workers x threads than cores (or one worker) there is no binding, and the first case is
    a named gap of the isolation line."""
    monkeypatch.setattr(isolation.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    assert isolation.core_sets(2, 1) == ([(0,), (1,)], None)
    assert isolation.core_sets(2, 2) == ([(0, 1), (2, 5)], None)
    assert isolation.core_sets(1, 4) == (None, None)
    assert isolation.core_sets(3, 2) == (None, "3 workers x 2 threads > 4 cores")
    monkeypatch.setattr(isolation.os, "sched_getaffinity", lambda pid: {0})
    with Sandbox(TaskSpec(TOY_SCORER, {"steps": 1}, TOY_RUNNER),
                 resources=Resources(workers=2)) as sb:
        assert sb.cores is None
        assert "cores: shared" in sb.isolation_line
        assert "a core per concurrent runner (2 workers x 1 threads > 1 cores)" in sb.isolation_line
        assert sb.evaluate("def policy(c, h, t, s):\n    return 0\n", {}).passed


def test_the_isolation_line_names_each_missing_part(monkeypatch):
    """A runner without a part (Landlock on an old kernel, a pid namespace...) is named at
    start with what it leaves open, each part in its own words; where the kernel has
    Landlock, the probe of a real runner reports it."""
    from atlas.sandbox import landlock

    isolation.runner_features.cache_clear()
    monkeypatch.setattr(isolation, "runner_features", lambda mode: ())
    gaps = isolation.isolation_gaps("rlimits", "no cgroup v2 here")
    assert gaps == [*isolation.FEATURE_GAPS.values(),
                    isolation.MEMORY_GAP.format(why="no cgroup v2 here")]
    assert any(g.startswith("no Landlock") for g in gaps)
    assert isolation.isolation_gaps("rlimits") == list(isolation.FEATURE_GAPS.values())
    monkeypatch.undo()
    if landlock.abi_version() >= 1 and _private_scratch_works():
        assert "landlock" in isolation.runner_features(isolation.FALLBACK)
