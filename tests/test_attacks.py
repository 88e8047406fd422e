"""Regression corpus of attacks on the sandbox's trusted/untrusted split (issue 12).

Each program in ``tests/attacks/<task>/`` attacks one part of the design (frame walking to the
environment or the channel, forged, malformed and out-of-order frames, patched scorer
modules, lingering threads, leftover files and kernel objects, exotic return values, rebuilt
or stolen environments, future items in binpacking). Every one must end as a failure or an
honest score, twice in a row (a channel attack scores differently when its second run finds
what the first left), and afterwards the seed program's score on the same worker must be
exactly what it was, and a probe must find none of the files the attack planted.
``tests/attacks/*_known/`` hold holes not fixed yet, as strict xfails.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from atlas.sandbox import Sandbox
from atlas.sandbox.isolation import probe_bwrap
from atlas.sandbox.secret import SECRET_FILE, run_secret
from atlas.tasks.bandit import BanditTask
from atlas.types import FailureKind

ATTACKS = Path(__file__).with_name("attacks")
BANDIT_ATTACKS = sorted((ATTACKS / "bandit").glob("*.py"))
#: every attack falls back to playing arm 0 when its trick fails: its honest score is exactly
#: that of this program (the oracle scores 0, an attack that reached the environment more)
ARM0 = "def policy(contexts, history, t, state):\n    return 0\n"

PROBE = '''import os
import tempfile


def policy(contexts, history, t, state):
    if t == 0:
        for d in (".", tempfile.gettempdir(), "/tmp", "/dev/shm", os.environ.get("HOME", "."),
                  os.path.dirname(os.getcwd())):
            try:
                names = os.listdir(d)
            except OSError:
                continue
            left = [n for n in names if n.startswith("atlas_leftover")]
            if left:
                raise RuntimeError(f"found {left} in {d}")
    return 0
'''

MODES = ["rlimits", pytest.param("bwrap", marks=pytest.mark.skipif(
    not probe_bwrap()[0], reason="bubblewrap unusable here"))]


@pytest.fixture(scope="module", params=MODES)
def bandit(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("attack-run")
    secret = run_secret(run_dir)
    task = BanditTask(T=200, env_seeds=[0, 1])
    with Sandbox.for_task(task, secret=secret, workers=1, isolation=request.param,
                          hide=[str(run_dir)]) as sb:
        seed = sb.evaluate(task.seed_program(), {"round": 1})
        arm0 = sb.evaluate(ARM0, {"round": 1})
        # the secret is drawn fresh (the real path), so the hidden environments differ per run:
        # "always arm 0" can beat the seed on T=200 (CI saw -0.547 vs -0.604); what the attack
        # checks need is two honest scores that differ, so an attack answering with the seed's
        # policy is told apart from the honest arm-0 score
        assert seed.passed and arm0.passed and arm0.score != seed.score, (seed, arm0)
        assert max(arm0.score, seed.score) < 0, (seed, arm0)
        yield sb, task, seed.score, arm0.score, run_dir / SECRET_FILE, secret


@pytest.mark.parametrize("path", BANDIT_ATTACKS, ids=lambda p: p.stem)
def test_bandit_attack_gets_a_failure_or_an_honest_score(bandit, path):
    sb, task, seed_score, honest, secret_path, secret = bandit
    code = path.read_text().replace("SECRET_PATH", str(secret_path))
    code = code.replace("SECRET_VALUE", secret)
    for run in range(2):  # the second run would find whatever the first left for it
        ev = sb.evaluate(code, {"round": 1})
        assert not ev.passed or ev.score == honest, (path.stem, run, ev)
        assert ev.failure_kind != FailureKind.OK.value or ev.passed
    after = sb.evaluate(task.seed_program(), {"round": 1})
    assert after.passed and after.score == seed_score, (path.stem, after)
    probe = sb.evaluate(PROBE, {"round": 1})
    assert probe.passed, (path.stem, probe.message)


@pytest.mark.parametrize("mode", MODES)
def test_hidden_paths_stay_unreadable_when_permissions_allow(mode):
    """The rlimits mode without root runs the candidate as the secret's owner: model that by
    making the run folder and the secret world-readable; the secret must still not be read."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="atlas-attack-"))  # every parent traversable
    run_dir = base / "run"
    secret = run_secret(run_dir)
    for p in (base, run_dir):
        os.chmod(p, 0o755)
    os.chmod(run_dir / SECRET_FILE, 0o644)
    task = BanditTask(T=50, env_seeds=[0, 1])
    code = (ATTACKS / "bandit" / "secret_unguarded.py").read_text()
    code = code.replace("SECRET_PATH", str(run_dir / SECRET_FILE)).replace("SECRET_VALUE",
                                                                          secret)
    try:
        with Sandbox.for_task(task, secret=secret, workers=1, isolation=mode,
                              hide=[str(run_dir)]) as sb:
            arm0 = sb.evaluate(ARM0, {"round": 1})
            ev = sb.evaluate(code, {"round": 1})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert arm0.passed and ev.passed and ev.score == arm0.score, ev


def test_exotic_returns_are_classified(bandit):
    sb = bandit[0]
    kinds = {p.stem: sb.evaluate(p.read_text(), {"round": 1}).failure_kind
             for p in BANDIT_ATTACKS if p.stem in (
                 "nan_return", "huge_int", "bool_return", "exotic_int_subclass",
                 "exotic_index_eq", "exotic_numpy_subclass")}
    assert kinds.pop("exotic_int_subclass") != "ok"  # caught by the runner or the scorer
    assert kinds == {"nan_return": "wrong_return", "huge_int": "wrong_return",
                     "bool_return": "wrong_return", "exotic_index_eq": "wrong_return",
                     "exotic_numpy_subclass": "wrong_return"}


@pytest.mark.parametrize("name", ["deep_json_nesting", "out_of_order_done", "error_kind_ok",
                                  "error_kind_unhashable", "nan_infinity_tokens"])
def test_malformed_frames_are_tampered_not_a_scorer_crash(bandit, name):
    sb = bandit[0]
    ev = sb.evaluate((ATTACKS / "bandit" / f"{name}.py").read_text(), {"round": 1})
    assert ev.failure_kind == FailureKind.TAMPERED.value, ev


BINPACKING_ATTACKS = sorted((ATTACKS / "binpacking").glob("*.py"))


@pytest.fixture(scope="module", params=MODES)
def binpacking(request, tmp_path_factory):
    from atlas.tasks.binpacking import BinPackingTask

    run_dir = tmp_path_factory.mktemp("attack-run-bp")
    secret = run_secret(run_dir)
    task = BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=16)
    with Sandbox.for_task(task, secret=secret, workers=1, isolation=request.param,
                          hide=[str(run_dir)]) as sb:
        seed = sb.evaluate(task.seed_program(), task.context(1))
        assert seed.passed and seed.score < 0, seed
        yield sb, task, seed.score


@pytest.mark.parametrize("path", BINPACKING_ATTACKS, ids=lambda p: p.stem)
def test_binpacking_attack_gets_a_failure_or_an_honest_score(binpacking, path):
    """Every binpacking attack falls back to best fit (the seed): its honest score is the
    seed's; a better one means it packed with knowledge an online priority cannot have."""
    sb, task, seed_score = binpacking
    code = path.read_text()
    for _ in range(2):
        ev = sb.evaluate(code, task.context(1))
        assert not ev.passed or ev.score == seed_score, (path.stem, ev)
        assert ev.failure_kind != FailureKind.OK.value or ev.passed
    after = sb.evaluate(task.seed_program(), task.context(1))
    assert after.passed and after.score == seed_score, (path.stem, after)


def test_binpacking_scored_instances_are_drawn_from_the_secret():
    """The generated set a run scores is not the public draw a program can rebuild from the
    config (public_instances_offline carries an offline packing of that one), and it follows
    the secret: same secret, same set; another secret, another set."""
    from atlas.tasks.binpacking import BinPackingTask

    task = BinPackingTask(weibull_count=2, weibull_items=300)
    public = task.scored_instances(None)
    a, b = task.scored_instances("ab" * 32), task.scored_instances("cd" * 32)
    assert [i.items for i in a] == [i.items for i in task.scored_instances("ab" * 32)]
    assert all(x.items != y.items for x, y in zip(a, public))
    assert all(x.items != y.items for x, y in zip(a, b))


def test_secret_is_stable_per_run_folder_and_hidden_environments_differ(tmp_path):
    first = run_secret(tmp_path / "a")
    assert run_secret(tmp_path / "a") == first
    assert oct(os.stat(tmp_path / "a" / SECRET_FILE).st_mode & 0o777) == "0o600"
    shared = tmp_path / "shared.secret"
    assert run_secret(tmp_path / "b", str(shared), create=True) == run_secret(tmp_path / "c",
                                                                               str(shared))
    assert run_secret(tmp_path / "b") != first
    from atlas.tasks.bandit.evaluator import build_envs

    cfg = {**BanditTask(T=50).evaluator_config()}
    public = build_envs(cfg)
    hidden = build_envs(cfg, first)
    assert [e.seed for e in hidden] == [e.seed for e in public]
    assert not any(math.isclose(float(a.contexts[0, 0, 0]), float(b.contexts[0, 0, 0]))
                   for a, b in zip(public, hidden))


def test_legacy_task_score_out_of_range_is_tampered():
    toy = "atlas.sandbox.testing:make_toy_evaluator"
    code = (ATTACKS / "legacy_patch_score.py").read_text()
    with Sandbox(toy, {"steps": 10}, workers=1, score_range=(-math.inf, 0.0),
                 isolation="rlimits") as sb:
        ev = sb.evaluate(code, {})
        assert ev.failure_kind == FailureKind.TAMPERED.value and not ev.passed, ev
        good = "def policy(contexts, history, t, state):\n    return 0\n"
        ok = sb.evaluate(good, {})
        assert ok.passed and ok.score <= 0


PINN_ATTACKS = sorted((ATTACKS / "pinn").glob("*.py"))
PINN_SMALL = {"name": "pinn", "n_steps": 30, "n_collocation": 128, "n_initial": 32,
              "n_boundary": 32, "n_val_collocation": 256, "n_val_initial": 64,
              "n_val_boundary": 64, "width": 16, "depth": 2, "exact_nx": 64, "exact_nt": 21,
              "val_resample": "per_round", "score": "paper", "timeout_s": 120}


@pytest.mark.slow
def test_pinn_attacks_get_a_failure_or_an_honest_score_and_leave_the_seed_alone():
    pytest.importorskip("jax")
    from atlas.tasks.pinn import PinnTask

    task = PinnTask(**PINN_SMALL)
    ctx = task.context(2)
    mode = "bwrap" if probe_bwrap()[0] else "rlimits"
    with Sandbox.for_task(task, workers=1, isolation=mode, memory_mb=3072) as sb:
        seed = sb.evaluate(task.seed_program(), ctx)
        assert seed.passed and seed.score <= 0, seed
        for path in PINN_ATTACKS:
            ev = sb.evaluate(path.read_text(), ctx)
            if path.stem == "negative_own_loss":
                assert ev.failure_kind == FailureKind.TAMPERED.value, ev
            elif path.stem == "python_callback":  # cannot be exported: a clear failure
                assert ev.failure_kind == FailureKind.EXCEPTION.value, ev
                assert "no Python callbacks in the loss" in ev.message, ev
            elif path.stem == "leftover_files" and not ev.passed:  # the guard saw the writes
                assert "may only write inside its working directory" in ev.message, ev
            else:  # each trains with the seed's loss: exactly the seed's validation numbers
                assert ev.passed, (path.stem, ev)
                assert ev.metrics["val_loss"] == pytest.approx(seed.metrics["val_loss"],
                                                               rel=1e-5), path.stem
                assert ev.score == pytest.approx(seed.score, rel=1e-5), path.stem
            after = sb.evaluate(task.seed_program(), ctx)
            assert after.passed and after.score == seed.score, (path.stem, after)
            assert after.metrics["val_loss"] == seed.metrics["val_loss"], path.stem
