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

import contextlib
import math
import os
import secrets
from pathlib import Path

import pytest

from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.sandbox.inputs import INPUTS_OF
from atlas.sandbox.isolation import probe_bwrap
from atlas.sandbox.secret import SECRET_FILE, run_secret
from atlas.tasks.bandit import BanditTask
from atlas.types import FailureKind
from tests.attacks import fill, verdict
from tests.conftest import pin_secret

ATTACKS = Path(__file__).with_name("attacks")
BANDIT_ATTACKS = sorted((ATTACKS / "bandit").glob("*.py"))
#: every attack falls back to playing arm 0 when its trick fails: its honest score is exactly
#: that of this program (the oracle scores 0, an attack that reached the environment more)
ARM0 = "def policy(contexts, history, t, state):\n    return 0\n"
#: every program here faces the same hidden inputs (``INPUTS_OF``), as all did before each
#: program got its own (``atlas.sandbox.inputs``), so an attack is judged against its honest
#: fallback's score on exactly its inputs, and runs again on purpose (``score_once=False``);
#: a program's own inputs and the relays they defeat are tested in ``test_relays.py``
CTX = {"round": 1, INPUTS_OF: "attack-suite"}

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


REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _planted():
    """What the attacks look for (filled into their placeholders): a root-only token in a
    folder every runner sees (/etc; where the tests do not run as root, /etc/shadow), an
    ``.env`` with a key in the clone's root, a file in the host's /dev/shm."""
    tag = secrets.token_hex(4)
    made: list[Path] = []
    token = Path("/etc/shadow")
    if os.getuid() == 0:
        token = Path(f"/etc/atlas-attack-token-{tag}")
        token.write_text("root-only-token\n")
        os.chmod(token, 0o600)
        made.append(token)
    env = REPO / ".env"
    if not env.exists() and os.access(REPO, os.W_OK):
        env.write_text("OPENAI_API_KEY=sk-attack-canary\n")
        os.chmod(env, 0o644)
        made.append(env)
    shm = Path(f"/dev/shm/atlas-attack-{tag}")
    shm.write_text("host shared memory\n")
    os.chmod(shm, 0o644)
    made.append(shm)
    try:
        yield {"ROOT_TOKEN_PATH": str(token), "REPO_DIR": str(REPO), "DEV_SHM_FILE": str(shm)}
    finally:
        for p in made:
            p.unlink(missing_ok=True)


def _targets(sb: Sandbox) -> list[int]:
    """The host pids of the slot's scorer and zygote: what attacks on other processes aim at."""
    worker = sb._all[0].worker
    return sorted({worker.pid, *(z.pid for z in worker.children())})


@pytest.fixture(scope="module", params=MODES)
def bandit(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("attack-run")
    secret = run_secret(run_dir)
    (run_dir / "programs.jsonl").write_text('{"code": "def policy(): return 0"}\n')
    task = BanditTask(T=200, env_seeds=[0, 1])
    with _planted() as planted, Sandbox.for_task(
            task, secret=secret, resources=Resources(workers=1),
            confinement=Confinement(score_once=False, isolation=request.param, hide=(str(run_dir),))) as sb:
        seed = sb.evaluate(task.seed_program(), CTX)
        arm0 = sb.evaluate(ARM0, CTX)
        # the secret is drawn fresh (the real path), so the hidden environments differ per run:
        # "always arm 0" can beat the seed on T=200 (CI saw -0.547 vs -0.604); what the attack
        # checks need is two honest scores that differ, so an attack answering with the seed's
        # policy is told apart from the honest arm-0 score
        assert seed.passed and arm0.passed and arm0.score != seed.score, (seed, arm0)
        assert max(arm0.score, seed.score) < 0, (seed, arm0)
        sb.attack_fill = {**planted, "SECRET_PATH": str(run_dir / SECRET_FILE),
                          "SECRET_VALUE": secret, "TARGET_PIDS": _targets(sb)}
        yield sb, task, seed.score, arm0.score, run_dir / SECRET_FILE, secret


@pytest.mark.parametrize("path", BANDIT_ATTACKS, ids=lambda p: p.stem)
def test_bandit_attack_gets_a_failure_or_an_honest_score(bandit, path):
    """Each attack ends as one of the outcomes its first line declares (tests/attacks/), in
    both runs; one that dies before trying fails the test as "did not run"."""
    sb, task, seed_score, honest, secret_path, secret = bandit
    code = fill(path.read_text(), **sb.attack_fill)
    for run in range(2):  # the second run would find whatever the first left for it
        ev = sb.evaluate(code, CTX)
        why = verdict(path, ev, honest)
        assert why is None, f"run {run}: {why}"
        assert ev.failure_kind != FailureKind.OK.value or ev.passed
    after = sb.evaluate(task.seed_program(), CTX)
    assert after.passed and after.score == seed_score, (path.stem, after)
    probe = sb.evaluate(PROBE, CTX)
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
        with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                              confinement=Confinement(score_once=False, isolation=mode, hide=(str(run_dir),))) as sb:
            arm0 = sb.evaluate(ARM0, CTX)
            ev = sb.evaluate(code, CTX)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert arm0.passed and ev.passed and ev.score == arm0.score, ev


def test_exotic_returns_are_classified(bandit):
    sb = bandit[0]
    kinds = {p.stem: sb.evaluate(p.read_text(), CTX).failure_kind
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
    ev = sb.evaluate((ATTACKS / "bandit" / f"{name}.py").read_text(), CTX)
    assert ev.failure_kind == FailureKind.TAMPERED.value, ev


BINPACKING_ATTACKS = sorted((ATTACKS / "binpacking").glob("*.py"))


@pytest.fixture(scope="module", params=MODES)
def binpacking(request, tmp_path_factory):
    from atlas.tasks.binpacking import BinPackingTask

    run_dir = tmp_path_factory.mktemp("attack-run-bp")
    # pinned: sizes are rounded to integers, so a state of the hidden set can equal one of the
    # public draw by chance, where public_instances_offline answers from its table instead of
    # best fit; the verdict asks for best fit's score exactly, so its inputs must not vary
    pin_secret(run_dir)
    secret = run_secret(run_dir)
    task = BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=16)
    with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                          confinement=Confinement(score_once=False, isolation=request.param,
                                                  hide=(str(run_dir),))) as sb:
        seed = sb.evaluate(task.seed_program(), {**task.context(1), INPUTS_OF: "attack-suite"})
        assert seed.passed and seed.score < 0, seed
        yield sb, task, seed.score


@pytest.mark.parametrize("path", BINPACKING_ATTACKS, ids=lambda p: p.stem)
def test_binpacking_attack_gets_a_failure_or_an_honest_score(binpacking, path):
    """Every binpacking attack falls back to best fit (the seed): its honest score is the
    seed's; a better one means it packed with knowledge an online priority cannot have.
    Each ends as an outcome its first line declares (tests/attacks/__init__.py)."""
    sb, task, seed_score = binpacking
    code = path.read_text()
    for run in range(2):
        ev = sb.evaluate(code, {**task.context(1), INPUTS_OF: "attack-suite"})
        why = verdict(path, ev, seed_score)
        assert why is None, f"run {run}: {why}"
        assert ev.failure_kind != FailureKind.OK.value or ev.passed
    after = sb.evaluate(task.seed_program(), {**task.context(1), INPUTS_OF: "attack-suite"})
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


def test_a_program_that_patches_numpy_scores_what_it_honestly_plays():
    """The scorer averages regrets in its own process: a program that patches ``np.mean``
    where it runs bends nothing, and the pool's range check lets the honest score through."""
    from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER, toy_in_process

    code = (ATTACKS / "patch_numpy_mean.py").read_text()
    honest = toy_in_process({"steps": 10}, {}, ARM0).score
    with Sandbox(TaskSpec(TOY_SCORER, {"steps": 10}, TOY_RUNNER, score_range=(-math.inf, 0.0)),
                 resources=Resources(workers=1), confinement=Confinement(score_once=False, isolation="rlimits")) as sb:
        for _ in range(2):
            ev = sb.evaluate(code, {})
            assert ev.passed and ev.score == honest and honest < 0, ev
        ok = sb.evaluate(ARM0, {})
        assert ok.passed and ok.score == honest


PINN_ATTACKS = sorted((ATTACKS / "pinn").glob("*.py"))
PINN_SMALL = {"name": "pinn", "n_steps": 30, "n_collocation": 128, "n_initial": 32,
              "n_boundary": 32, "n_val_collocation": 256, "n_val_initial": 64,
              "n_val_boundary": 64, "width": 16, "depth": 2, "exact_nx": 64, "exact_nt": 21,
              "score": "paper", "timeout_s": 120}


@pytest.mark.slow
def test_pinn_attacks_get_a_failure_or_an_honest_score_and_leave_the_seed_alone():
    pytest.importorskip("jax")
    from atlas.tasks.pinn import PinnTask

    task = PinnTask(**PINN_SMALL)
    ctx = task.context(2)
    mode = "bwrap" if probe_bwrap()[0] else "rlimits"
    with Sandbox.for_task(task, resources=Resources(workers=1, memory_mb=3072),
                          confinement=Confinement(score_once=False, isolation=mode)) as sb:
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
                # the scorer's own clock, never the runner's number (forged_export_seconds)
                assert 0 < ev.metrics["candidate_export_s"] < 600, (path.stem, ev.metrics)
                assert ev.metrics["val_loss"] == pytest.approx(seed.metrics["val_loss"],
                                                               rel=1e-5), path.stem
                assert ev.score == pytest.approx(seed.score, rel=1e-5), path.stem
            after = sb.evaluate(task.seed_program(), ctx)
            assert after.passed and after.score == seed.score, (path.stem, after)
            assert after.metrics["val_loss"] == seed.metrics["val_loss"], path.stem


# ------------------------------------------------------------------ issue 22: no channel, no secret
ARM1 = "def policy(contexts, history, t, state):\n    return 1\n"


def test_metadata_relay_reaches_no_later_candidate(bandit):
    """Three candidates in a row would play arms 0, 1 and 2 through an xattr, the mode bits or
    the mtime of the directories around their scratch; each plays arm 0 (its own tmpfs goes
    with it, the rest is denied by seccomp, and the attempt fails as ``blocked``)."""
    sb, task, seed_score, honest, _, _ = bandit
    code = (ATTACKS / "bandit" / "metadata_relay.py").read_text()
    scores = [sb.evaluate(code, CTX) for _ in range(3)]
    assert all(ev.failure_kind == FailureKind.BLOCKED.value or (ev.passed and ev.score == honest)
               for ev in scores), scores
    after = sb.evaluate(task.seed_program(), CTX)
    assert after.passed and after.score == seed_score, after


def test_page_cache_probes_fail_though_ctypes_is_reachable(bandit):
    """ctypes is reachable through sys.modules (the guard does not matter here): the program
    that finds it and calls libc plays arm 1. The page-cache probes made through it and
    through os (mincore, readahead, cachestat, posix_fadvise, preadv2 RWF_NOWAIT) all fail:
    seccomp, not the guard, is the barrier, and names them."""
    sb, task, seed_score, honest, _, _ = bandit
    reach = ("import sys\n\ndef policy(contexts, history, t, state):\n"
             "    c = sys.modules.get('ctypes')\n"
             "    return 1 if c is not None and c.CDLL(None).getpid() > 0 else 0\n")
    arm1 = sb.evaluate(ARM1, CTX)
    reached = sb.evaluate(reach, CTX)
    assert arm1.passed and reached.passed and reached.score == arm1.score != honest, reached
    for _ in range(2):  # the probes fail, and the attempt is named
        ev = sb.evaluate((ATTACKS / "bandit" / "page_cache_probe.py").read_text(), CTX)
        assert ev.failure_kind == FailureKind.BLOCKED.value, ev
        assert "mincore" in ev.message and "readahead" in ev.message, ev.message
    after = sb.evaluate(task.seed_program(), CTX)
    assert after.passed and after.score == seed_score, after


def test_chmod_of_the_scratch_does_not_kill_the_next_candidate(bandit):
    sb, task, seed_score, honest, _, _ = bandit
    code = (ATTACKS / "bandit" / "chmod_scratch.py").read_text()
    for _ in range(2):
        ev = sb.evaluate(code, CTX)
        assert not ev.passed or ev.score == honest, ev
        after = sb.evaluate(task.seed_program(), CTX)
        assert after.passed and after.score == seed_score, after


def _sweep_layout(base: Path) -> dict[str, Path]:
    """What a Hydra sweep and its neighbours leave on disk: a sweep folder with its shared
    secret and two jobs (each with a copy of it and its own programs.jsonl), a second
    sweep, and a single run."""
    shared = base / "multirun" / "study" / SECRET_FILE
    paths = {"shared": shared}
    for name, run, source in (("job_a", "multirun/study/job_a", shared),
                              ("job_b", "multirun/study/job_b", shared),
                              ("other_sweep", "multirun/other/job_c", None),
                              ("single_run", "outputs/exp/run_d", None)):
        run_dir = base / run
        run_secret(run_dir, str(source) if source else None, create=True)
        (run_dir / "programs.jsonl").write_text('{"code": "def policy(): return 0"}\n')
        paths[name] = run_dir
    # world-readable, as if the candidate ran as the owner (the rlimits mode without root):
    # permissions stop nothing, the masks must
    for d in [base, *base.rglob("*")]:
        os.chmod(d, 0o755 if d.is_dir() else 0o644)
    return paths


SWEEP_PLACES = ["tmp", "var_tmp"]


@pytest.fixture(scope="module", params=[(m, p) for m in MODES for p in SWEEP_PLACES],
                ids=lambda mp: f"{getattr(mp[0], 'values', [mp[0]])[0]}-{mp[1]}")
def sweep(request, tmp_path_factory):
    """The job under attack (job_a) in a sweep, hidden exactly as ``atlas/loop.py`` does:
    its run folder and the sweep's secret file; the sweep under /tmp or elsewhere
    (/var/tmp: no private tmpfs covers it)."""
    import shutil
    import tempfile

    mode, place = request.param
    if hasattr(mode, "values"):  # a pytest.param with its skip mark
        for mark in mode.marks:
            if mark.args and mark.args[0]:
                pytest.skip(mark.kwargs.get("reason", "skipped"))
        mode = mode.values[0]
    base = (tmp_path_factory.mktemp("sweep") if place == "tmp"
            else Path(tempfile.mkdtemp(prefix="atlas-sweep-", dir="/var/tmp")))
    paths = _sweep_layout(base)
    secret = (paths["job_a"] / SECRET_FILE).read_text().strip()
    task = BanditTask(T=100, env_seeds=[0, 1])
    try:
        with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                              confinement=Confinement(score_once=False, isolation=mode, hide=(
                                  str(paths["job_a"]), str(paths["shared"])))) as sb:
            seed = sb.evaluate(task.seed_program(), CTX)
            arm0 = sb.evaluate(ARM0, CTX)
            assert seed.passed and arm0.passed and seed.score != arm0.score, (seed, arm0)
            yield sb, task, seed.score, arm0.score, paths
    finally:
        if place != "tmp":
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("target", ["job_a", "job_b", "shared", "other_sweep", "single_run"])
def test_no_run_secret_is_readable_from_a_sweep_job(sweep, target):
    """Its own run's secret, a sibling job's copy of the shared one, the sweep's secret file,
    another sweep's and a single run's: none is read (each attack twice, then the seed)."""
    sb, task, seed_score, honest, paths = sweep
    path = paths[target] if target == "shared" else paths[target] / SECRET_FILE
    code = (ATTACKS / "bandit" / "secret_unguarded.py").read_text()
    code = code.replace("SECRET_PATH", str(path)).replace("SECRET_VALUE",
                                                           path.read_text().strip())
    for run in range(2):
        ev = sb.evaluate(code, CTX)
        assert ev.passed and ev.score == honest, (target, run, ev)
    after = sb.evaluate(task.seed_program(), CTX)
    assert after.passed and after.score == seed_score, (target, after)


@pytest.mark.parametrize("target", ["job_a", "job_b", "shared", "other_sweep", "single_run"])
def test_no_masked_path_can_be_told_to_exist(sweep, target):
    """stat, lstat, access, an O_PATH descriptor, chdir, readlink, getxattr, statfs and the
    parent's listing of a masked secret, its run folder and its records answer as for a
    name that never existed (ENOENT), in every mode: no size, time or existence leaks
    (``tests/attacks/bandit/masked_metadata.py``)."""
    sb, task, seed_score, honest, paths = sweep
    path = paths[target] if target == "shared" else paths[target] / SECRET_FILE
    code = (ATTACKS / "bandit" / "masked_metadata.py").read_text().replace("SECRET_PATH",
                                                                           str(path))
    ev = sb.evaluate(code, CTX)
    assert ev.passed and ev.score == honest, (target, ev)
    # the attack can tell where there is something to tell: a file of the code view is seen
    import atlas

    visible = (ATTACKS / "bandit" / "masked_metadata.py").read_text().replace(
        "SECRET_PATH", os.path.join(os.path.dirname(atlas.__file__), "__init__.py"))
    seen = sb.evaluate(visible, CTX)
    assert seen.passed and seen.score != honest, seen


def test_no_sibling_records_are_found_through_mountinfo(sweep):
    sb, task, seed_score, honest, paths = sweep
    code = (ATTACKS / "bandit" / "sibling_records_mountinfo.py").read_text()
    code = code.replace("SIBLING_DIR", str(paths["job_b"]))
    for run in range(2):
        ev = sb.evaluate(code, CTX)
        assert ev.passed and ev.score == honest, (run, ev)
    after = sb.evaluate(task.seed_program(), CTX)
    assert after.passed and after.score == seed_score, after


CLONE_SCRIPT = '''
import json, sys
from pathlib import Path
import atlas
from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.secret import run_secret
from atlas.tasks.bandit import BanditTask

mode, run_dir, *attacks = sys.argv[1:]
secret = run_secret(run_dir)
task = BanditTask(T=60, env_seeds=[0, 1])
arm0 = "def policy(contexts, history, t, state):\\n    return 0\\n"
with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                      confinement=Confinement(score_once=False, isolation=mode, hide=(run_dir,))) as sb:
    out = {"atlas": atlas.__file__, "hide": sb.hide, "isolation": sb.isolation}
    out["seed"] = [sb.evaluate(task.seed_program(), {"round": 1, "inputs_of": "attack-suite"}).score]
    out["arm0"] = sb.evaluate(arm0, {"round": 1, "inputs_of": "attack-suite"}).score
    codes = [Path(a).read_text().replace("SECRET_VALUE", secret) for a in attacks]
    out["attacks"] = [sb.evaluate(code, {"round": 1, "inputs_of": "attack-suite"}).to_dict()
                      for code in codes for _ in range(2)]
    out["seed"].append(sb.evaluate(task.seed_program(), {"round": 1, "inputs_of": "attack-suite"}).score)
print("RESULT", json.dumps(out))
'''


@pytest.mark.parametrize("mode", MODES)
def test_the_mask_holds_with_the_clone_and_the_run_folder_under_tmp(mode, tmp_path):
    """A clone under /tmp is bound back into the private /tmp; its output trees (this run and
    a sibling sweep job) must stay masked: the masks come after that bind. Masked also means
    absent: neither run folder can be told to exist (``masked_metadata``)."""
    import json
    import shutil
    import subprocess
    import sys

    import atlas

    clone = tmp_path / "clone"
    shutil.copytree(Path(atlas.__file__).parent, clone / "atlas",
                    ignore=shutil.ignore_patterns("__pycache__"))
    run_dir = clone / "outputs" / "exp" / "run"
    sibling = clone / "multirun" / "study" / "job_b"
    run_secret(sibling)
    (sibling / "programs.jsonl").write_text('{"code": "x"}\n')
    attack = tmp_path / "attack.py"
    attack.write_text((ATTACKS / "bandit" / "secret_unguarded.py").read_text().replace(
        "SECRET_PATH", str(run_dir / SECRET_FILE)))
    sibling_attack = tmp_path / "sibling.py"
    sibling_attack.write_text((ATTACKS / "bandit" / "sibling_records_mountinfo.py").read_text()
                              .replace("SIBLING_DIR", str(sibling)))
    masked = []  # the run folder below outputs/ and the sibling below multirun/ look absent
    for target in (run_dir / SECRET_FILE, sibling / SECRET_FILE):
        masked.append(tmp_path / f"masked_{len(masked)}.py")
        masked[-1].write_text((ATTACKS / "bandit" / "masked_metadata.py").read_text()
                              .replace("SECRET_PATH", str(target)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", CLONE_SCRIPT, mode, str(run_dir), str(attack),
                           str(sibling_attack), *map(str, masked)], cwd=clone,
                          env={**env, "PYTHONPATH": str(clone)},
                          capture_output=True, text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["atlas"].startswith(str(clone)), out
    assert str(clone / "outputs") in out["hide"] and str(clone / "multirun") in out["hide"], out
    assert out["seed"][0] == out["seed"][1] != out["arm0"], out
    for ev in out["attacks"]:
        assert ev["passed"] and ev["score"] == out["arm0"], ev


def test_pinn_validation_points_follow_the_secret_and_the_regime_only():
    pytest.importorskip("jax")
    import numpy as np

    from atlas.tasks.pinn.problem import PinnConfig, validation_points, viscosity

    cfg = PinnConfig()
    nu = viscosity(1, cfg)
    assert viscosity(2, cfg) == nu  # rounds 1 and 2: one regime (hold_rounds=4)
    a, b = validation_points(cfg, nu, 7), validation_points(cfg, viscosity(2, cfg), 7)
    np.testing.assert_array_equal(a.x_f, b.x_f)
    assert not np.array_equal(a.x_f, validation_points(cfg, nu, 8).x_f)
    assert not np.array_equal(a.x_f, validation_points(cfg, viscosity(5, cfg), 7).x_f)


def test_pinn_seed_with_a_comment_scores_identically():
    """One hidden evaluation per regime: the validation points come from the run's secret and
    the viscosity, never from the code, so a comment changes nothing."""
    pytest.importorskip("jax")
    from atlas.tasks.pinn import PinnTask

    task = PinnTask(**PINN_SMALL)
    ctx = {**task.context(1), INPUTS_OF: "attack-suite"}
    seed = task.seed_program()
    mode = "bwrap" if probe_bwrap()[0] else "rlimits"
    with Sandbox.for_task(task, resources=Resources(workers=1, memory_mb=3072),
                          confinement=Confinement(score_once=False, isolation=mode)) as sb:
        evs = [sb.evaluate(code, ctx) for code in (seed, seed + "\n# tuned by hand\n",
                                                   "# another comment\n" + seed)]
    assert all(ev.passed for ev in evs), evs
    assert evs[0].score == evs[1].score == evs[2].score, [ev.score for ev in evs]
    assert evs[0].metrics["val_loss"] == evs[1].metrics["val_loss"] == evs[2].metrics["val_loss"]


def test_hidden_roots_cover_every_run_of_the_tree_and_no_code(tmp_path):
    """The mask widens from the job's folder to its whole output tree (siblings, the sweep's
    secret, another sweep), stops below any code path, and adds Hydra's roots of the launch
    directory; the bwrap arguments mask them after the private /tmp and its re-binds."""
    from atlas.sandbox.isolation import bwrap_args
    from atlas.sandbox.view import code_paths, hidden_roots

    paths = _sweep_layout(tmp_path)
    launch = tmp_path / "launch"
    (launch / "multirun").mkdir(parents=True)
    roots = hidden_roots([str(paths["job_a"]), str(paths["shared"])], cwd=str(launch))

    def covered(p: Path) -> bool:
        return any(str(p) == r or str(p).startswith(r + "/") for r in roots)

    assert all(covered(p) for p in paths.values()), roots
    assert covered(launch / "multirun"), roots
    assert not any(c == r or c.startswith(r + "/") for c in code_paths() for r in roots)
    import atlas

    inside = str(Path(atlas.__file__).resolve().parents[1] / "tests")  # in a bound code path
    args = bwrap_args("bwrap", 64, [inside])
    assert args[args.index(inside) - 1] == "--tmpfs", args
    private_tmp = next(i for i in range(len(args) - 1) if args[i:i + 2] == ["--tmpfs", "/tmp"])
    assert args.index(inside) > private_tmp, args


def test_a_random_policy_with_a_comment_scores_identically(bandit):
    """The candidate's own unseeded random draws come from the regime, not the program's
    text: a copy with a comment added plays the same arms and scores the same."""
    sb = bandit[0]
    code = ("import random\nimport numpy as np\n\n\ndef policy(contexts, history, t, state):\n"
            "    return int(np.random.randint(len(contexts))) if random.random() < 0.9 else 0\n")
    evs = [sb.evaluate(c, CTX) for c in (code, code + "# tuned\n", "# v2\n" + code)]
    assert all(ev.passed for ev in evs) and len({ev.score for ev in evs}) == 1, evs


# ------------------------------------------------------------------ issue 29: isolation by construction
CANARIES = {"OPENAI_API_KEY": "sk-canary-openai-4f1d", "HF_TOKEN": "hf_canary_9c2e",
            "WANDB_API_KEY": "wandb-canary-77ab", "FOO_SECRET": "foo-canary-5e3a"}
#: what a candidate reports of its process: pid, the pid /proc/self names, every pid it can see
PID_VIEW = '''import os


def policy(contexts, history, t, state):
    try:
        pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    except OSError:  # Landlock: /proc is not listable, only /proc/self readable
        pids = "unlisted"
    raise ValueError((os.getpid(), os.getppid(), os.readlink("/proc/self"), pids))
'''


def _toy(mode: str, *, timeout_s: float = 30.0, **resources: int) -> Sandbox:
    from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER

    return Sandbox(TaskSpec(TOY_SCORER, {"steps": 10}, TOY_RUNNER, timeout_s=timeout_s),
                   resources=Resources(**resources), confinement=Confinement(score_once=False, isolation=mode))


@pytest.mark.parametrize("mode", MODES)
def test_no_credential_of_the_environment_reaches_a_candidate(mode, monkeypatch):
    """Canary credentials planted in the environment are in none of what a candidate can
    read (its environment, /proc/self/environ, its parent's, every environ it sees), and so
    in no failure message that a record would carry."""
    for k, v in CANARIES.items():
        monkeypatch.setenv(k, v)
    code = (ATTACKS / "bandit" / "env_canary.py").read_text().replace("CANARY", "OPENAI")
    probe = code.replace('"PASSWORD", "OPENAI"', '"PASSWORD", "OPENAI", ""')  # every variable
    with _toy(mode, workers=1) as sb:
        ev = sb.evaluate(code, {})
        everything = sb.evaluate(probe, {})
    assert ev.passed, ev
    assert not everything.passed and "found credentials" in everything.message  # it reads
    for value in CANARIES.values():
        assert value not in everything.message


@pytest.mark.parametrize("mode", MODES)
def test_a_runner_sees_only_itself_and_its_pid_says_nothing(mode):
    """Every runner is pid 1 of its own pid namespace, with a /proc of that namespace (not
    even listable where Landlock holds): the same view whatever ran before, a
    thread-starting candidate included."""
    threads = ("import sys\n\ndef policy(contexts, history, t, state):\n"
               "    th = sys.modules['threading']\n"
               "    for _ in range(50):\n"
               "        x = th.Thread(target=lambda: None)\n        x.start()\n        x.join()\n"
               "    return 0\n")
    with _toy(mode, workers=1) as sb:
        first = sb.evaluate(PID_VIEW, {})
        sb.evaluate(threads, {})
        second = sb.evaluate(PID_VIEW, {})
    assert first.message == second.message, (first.message, second.message)
    assert first.message in ("ValueError (line 9): (1, 0, '1', [1])",
                             "ValueError (line 9): (1, 0, '1', 'unlisted')"), first.message


def _host_state(pid: int) -> dict:
    import psutil

    p = psutil.Process(pid)
    return {"rlimits": {r: p.rlimit(r) for r in (psutil.RLIMIT_AS, psutil.RLIMIT_CPU,
                                                  psutil.RLIMIT_DATA, psutil.RLIMIT_MSGQUEUE,
                                                  psutil.RLIMIT_NOFILE, psutil.RLIMIT_NPROC)},
            "nice": p.nice(), "affinity": p.cpu_affinity(), "ionice": tuple(p.ionice()),
            "sched": os.sched_getscheduler(pid)}


@pytest.mark.parametrize("mode", MODES)
def test_zygote_and_scorer_keep_their_limits_and_scheduling(mode):
    """A candidate that re-limits, re-nices, re-pins and re-schedules every process it can
    name (inherited_state_channel) changes neither the scorer's nor the zygote's state; it
    fails as ``blocked`` and the next candidate starts from the same state. Quiet, the three
    runs take about a second; at a load average of 10-19 on 2 cores they ran past the toy's
    30 s bound, which is there to catch a hang, not to time the machine."""
    with _toy(mode, workers=1, timeout_s=180.0) as sb:
        assert sb.evaluate(ARM0, {}).passed
        slot = sb._all[0]
        scorer = slot.worker.pid
        zygote = slot.worker.children()[0].pid
        code = fill((ATTACKS / "bandit" / "inherited_state_channel.py").read_text(),
                    TARGET_PIDS=[scorer, zygote])
        before = {pid: _host_state(pid) for pid in (scorer, zygote)}
        evs = [sb.evaluate(code, {}) for _ in range(3)]
        after = {pid: _host_state(pid) for pid in (scorer, zygote)}
        honest = sb.evaluate(ARM0, {})
    assert before == after
    assert all(ev.failure_kind == FailureKind.BLOCKED.value for ev in evs), evs
    assert "prlimit64" in evs[0].message and "setpriority" in evs[0].message, evs[0].message
    assert honest.passed


def test_the_filter_lets_calls_name_only_their_own_process():
    """In a child with the filter (errno mode): prlimit64, setpriority, sched_getaffinity,
    sched_setscheduler, ioprio_set and kill work on pid 0 or its own and fail with EPERM on
    its parent; process-wide calls (PRIO_USER), file locks, memfd_create, an unlisted call
    and sched_setaffinity even on itself (it would leave its worker's cores) fail."""
    import ctypes
    import errno
    import json

    from atlas.sandbox.seccomp import install_seccomp
    from atlas.sandbox.syscalls import X86_64

    if os.uname().machine != "x86_64":
        pytest.skip("numbers below are x86_64's")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = {}
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            me, parent = os.getpid(), os.getppid()
            nice = os.getpriority(os.PRIO_PROCESS, 0)  # set it again: allowed unprivileged
            install_seccomp()
            lim = (ctypes.c_uint64 * 2)()
            mask = ctypes.c_uint64(1)
            param = ctypes.c_int(0)

            def call(name, *args):
                ctypes.set_errno(0)
                rc = libc.syscall(X86_64[name], *args)
                return 0 if rc >= 0 else ctypes.get_errno()

            for who, tag in ((0, "zero"), (me, "self"), (parent, "parent")):
                out[f"prlimit64_{tag}"] = call("prlimit64", who, 7, None, lim)
                out[f"setpriority_{tag}"] = call("setpriority", 0, who, nice)
                out[f"sched_getaffinity_{tag}"] = call("sched_getaffinity", who, 8,
                                                       ctypes.byref(mask))
                out[f"sched_setscheduler_{tag}"] = call("sched_setscheduler", who, 0,
                                                        ctypes.byref(param))
                out[f"ioprio_get_{tag}"] = call("ioprio_get", 1, who)
                out[f"kill_{tag}"] = call("kill", who, 0)
            fd = os.open(__file__, os.O_RDONLY)
            lock = ctypes.create_string_buffer(32)  # struct flock: F_RDLCK, whole file
            out["fcntl_getfl"] = call("fcntl", fd, 3, 0)
            out["fcntl_setlk"] = call("fcntl", fd, 6, lock)
            out["flock"] = call("flock", fd, 1 | 4)  # LOCK_SH | LOCK_NB
            out["setpriority_user"] = call("setpriority", 2, 0, nice)
            out["memfd_create"] = call("memfd_create", b"x", 0)
            out["acct"] = call("acct", None)
            out["sched_setaffinity_self"] = call("sched_setaffinity", 0, 8, ctypes.byref(mask))
        except Exception as exc:  # noqa: BLE001
            out["error"] = repr(exc)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "error" not in out, out
    for name in ("prlimit64", "setpriority", "sched_getaffinity", "sched_setscheduler",
                 "ioprio_get", "kill"):
        assert out[f"{name}_zero"] == 0 and out[f"{name}_self"] == 0, (name, out)
        assert out[f"{name}_parent"] == errno.EPERM, (name, out)
    assert out["setpriority_user"] == out["memfd_create"] == out["acct"] == errno.EPERM, out
    assert out["sched_setaffinity_self"] == errno.EPERM, out
    # file locks on shared host files: a channel to a concurrent candidate
    assert out["fcntl_getfl"] == 0 and out["fcntl_setlk"] == out["flock"] == errno.EPERM, out


@pytest.mark.parametrize("mode", MODES)
def test_memory_in_every_form_counts_and_threads_are_capped(mode):
    """memfd (blocked: memfd_create is not allowed), anonymous shared memory (resident) and
    the scratch tmpfs (its bytes) count against the memory limit; 10,000 threads do not
    start. None of them is scored, and the next honest candidate is."""
    shared = ('import sys\n\n'
              'def policy(contexts, history, t, state):\n'
              '    if t == 0:\n'
              '        ct = sys.modules["ctypes"]\n        libc = ct.CDLL(None)\n'
              '        libc.mmap.restype = ct.c_void_p\n'
              '        addr = libc.mmap(None, 400 << 20, 3, 0x21, -1, 0)  # MAP_SHARED|ANON\n'
              '        ct.memset(addr, 1, 400 << 20)\n'
              '        sys.modules["time"].sleep(3)\n    return 0\n')
    scratch = ('import sys\n\ndef policy(contexts, history, t, state):\n'
               '    if t == 0:\n        state["a"] = bytearray(150 << 20)\n'
               '        for i in range(0, 150 << 20, 4096):\n            state["a"][i] = 1\n'
               '        for i in range(4):\n'
               '            with open(f"f{i}", "wb") as fh:\n'
               '                fh.write(b"x" * (40 << 20))\n'
               '        sys.modules["time"].sleep(3)\n    return 0\n')
    with _toy(mode, workers=1, memory_mb=256, timeout_s=20) as sb:
        memfd = sb.evaluate((ATTACKS / "bandit" / "memfd_hog.py").read_text(), {})
        shm = sb.evaluate(shared, {})
        tmpfs = sb.evaluate(scratch, {})
        threads = sb.evaluate((ATTACKS / "bandit" / "thread_bomb.py").read_text(), {})
        honest = sb.evaluate(ARM0, {})
    assert memfd.failure_kind == FailureKind.BLOCKED.value and "memfd_create" in memfd.message
    assert shm.failure_kind == FailureKind.KILLED.value, shm
    assert tmpfs.failure_kind == FailureKind.KILLED.value, tmpfs
    assert not threads.passed, threads
    assert honest.passed


@pytest.mark.parametrize("mode", MODES)
def test_a_candidate_cannot_touch_a_concurrent_one(mode):
    """Two workers: while an honest candidate runs in one, limit_others in the other limits
    every process it can name to 1 MB of address space; the honest one scores as alone,
    and so do the candidates after it in both workers."""
    slow = ("import numpy as np\nimport time\n\ndef policy(contexts, history, t, state):\n"
            "    time.sleep(0.05)\n    return int(np.zeros(1 << 16).sum())\n")
    with _toy(mode, workers=2, timeout_s=20) as sb:
        alone = sb.evaluate(slow, {})
        sb.evaluate_many([slow, slow], {})  # both workers up: the attack aims at both
        targets = sorted({p.pid for slot in sb._all for p in (slot.worker,
                                                              *slot.worker.children())})
        honest = sb.submit(slow, {})
        attack = sb.submit(fill((ATTACKS / "bandit" / "limit_others.py").read_text(),
                                TARGET_PIDS=targets), {})
        assert honest.result().score == alone.score and alone.passed, honest.result()
        assert attack.result().failure_kind == FailureKind.BLOCKED.value, attack.result()
        later = sb.evaluate_many([slow, slow, slow, slow], {})
        assert all(ev.passed and ev.score == alone.score for ev in later), later


def test_task_syscalls_are_checked():
    from atlas.sandbox.seccomp import check_extra_syscalls

    assert check_extra_syscalls(["memfd_create", "mlock"]) == ("memfd_create", "mlock")
    for bad, why in ((["ptrace"], "can never be allowed"), (["prlimit64"], "never"),
                     (["no_such_call"], "not a system call"), ("memfd_create", "a list")):
        with pytest.raises(ValueError, match=why):
            check_extra_syscalls(bad)


@pytest.mark.parametrize("mode", MODES)
def test_a_secret_file_masks_its_whole_folder(mode):
    """``sandbox.secret_file`` in a folder of the clone (bound for the code around it): the
    secret of another comparison beside it is not readable by name."""
    import shutil
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="atlas-attack-secrets-", dir=repo / "docs"))
    try:
        ours, other = folder / "ours.secret", folder / "other.secret"
        secret = run_secret(folder / "run", str(ours), create=True)
        other.write_text("ab" * 32 + "\n")
        for p in (folder, ours, other):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        read = ("def policy(contexts, history, t, state):\n"
                "    try:\n        open(OTHER).read()\n    except OSError:\n"
                "        return 0\n    return 1\n").replace("OTHER", repr(str(other)))
        task = BanditTask(T=50, env_seeds=[0, 1])
        with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                              confinement=Confinement(score_once=False, isolation=mode, hide=(
                                  str(folder / "run"), str(ours)))) as sb:
            arm0 = sb.evaluate(ARM0, CTX)
            ev = sb.evaluate(read, CTX)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert arm0.passed and (not ev.passed or ev.score == arm0.score), ev


def test_a_secret_in_a_code_or_system_folder_is_refused_in_one_line():
    from atlas.sandbox.view import secret_folder

    repo = Path(__file__).resolve().parents[1]
    for bad in (repo / "atlas" / ".task_secret", repo / "atlas" / "tasks" / "bandit" / "s",
                repo / "conf" / "s", repo / ".task_secret", Path("/etc/atlas.secret"),
                Path("/usr/local/s")):
        with pytest.raises(ValueError, match="lies directly in") as info:
            secret_folder(str(bad))
        assert "\n" not in str(info.value)
    for ok in (repo / "outputs" / "shared" / ".task_secret",
               repo / "multirun" / "2026" / ".task_secret",
               repo / "docs" / "study" / "runs" / "a" / ".task_secret"):
        assert secret_folder(str(ok)) == str(ok.parent)


def test_the_launch_directory_is_not_bound_and_the_clone_outputs_are_hidden(tmp_path,
                                                                          monkeypatch):
    """``python -m atlas.score`` from another directory: that directory (on ``sys.path``
    because of ``-m``) holds no module the sandbox needs, so it is neither bound nor
    readable; the clone's own ``outputs/`` is masked as in a run."""
    import sys

    from atlas.sandbox.view import code_paths, hidden_roots

    launch = tmp_path / "elsewhere"
    launch.mkdir()
    monkeypatch.chdir(launch)
    monkeypatch.syspath_prepend(str(launch))
    assert str(launch) in sys.path
    assert not any(str(launch) == p or str(launch).startswith(p + "/") for p in code_paths())
    outputs = Path(__file__).resolve().parents[1] / "outputs"
    if outputs.is_dir():
        assert str(outputs) in hidden_roots([])


@pytest.mark.slow
def test_no_canary_credential_reaches_any_file_of_a_run(tmp_path, monkeypatch):
    """A whole run (tiny model, W&B offline) with canary credentials in the environment and
    a seed program that fails, printing them, wherever it finds one: the run goes through
    and no file of the run folder (records, W&B's offline files) holds a canary."""
    from atlas.tasks.bandit import BanditTask
    from atlas.train import run
    from tests.conftest import compose_cfg

    for k, v in CANARIES.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    honest_seed = BanditTask.seed_program
    probe = (ATTACKS / "bandit" / "env_canary.py").read_text().replace(
        '"PASSWORD", "CANARY"', '"PASSWORD", "CANARY", "API", "HF_"')

    def seed(self) -> str:  # the seed's policy, after looking for credentials
        return probe.replace("def policy(", "def _probe_policy(") + "\n\n" + \
            honest_seed(self).replace("def policy(", "def _seed_policy(") + \
            "\n\ndef policy(contexts, history, t, state):\n" \
            "    _probe_policy(contexts, history, t, state)\n" \
            "    return _seed_policy(contexts, history, t, state)\n"

    monkeypatch.setattr(BanditTask, "seed_program", seed)
    cfg = compose_cfg(["experiment=test", "method=evotune", "logger=wandb", "explore.rounds=2"],
                      run_dir=tmp_path)
    run(cfg)
    leaked = []
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaked += [(str(path), k) for k, v in CANARIES.items() if v.encode() in data]
    assert not leaked, leaked
    assert (tmp_path / "programs.jsonl").exists()


def test_the_task_checker_fails_a_task_that_asks_for_a_forbidden_call():
    from atlas.tasks.checker import check_task

    class Greedy(BanditTask):
        syscalls = ("memfd_create", "ptrace")

    report = check_task(Greedy(T=50, env_seeds=[0, 1]), secrets=1, isolation="rlimits")
    assert not report.ok
    assert "'ptrace' can never be allowed" in report.text()


@pytest.mark.parametrize("mode", MODES)
def test_reading_a_host_file_moves_no_access_time(mode):
    """Access times on the host are a channel (a candidate reads a file, a later one stats
    it); the runner's view of the host is read-only, so a read moves nothing. The file lies
    in the toy task's package, which a runner may read."""
    import tempfile

    import atlas.sandbox

    fd, name = tempfile.mkstemp(prefix="atlas-atime-",
                                dir=Path(atlas.sandbox.__file__).parent)
    os.write(fd, b"x" * 4096)
    os.close(fd)
    os.chmod(name, 0o644)
    old = 1_000_000_000  # 2001: older than a day, so relatime would update it
    os.utime(name, (old, old))
    code = ("def policy(contexts, history, t, state):\n"
            f"    if t == 0:\n        open({name!r}, 'rb').read()\n    return 0\n")
    try:
        with _toy(mode, workers=1) as sb:
            ev = sb.evaluate(code, {})
        atime = os.stat(name).st_atime
    finally:
        os.unlink(name)
    assert ev.passed, ev
    assert atime == old


@pytest.mark.parametrize("mode", MODES)
def test_a_candidate_reads_only_its_own_process_and_the_machine_description(mode):
    """/proc and /sys hold counters every process shares (forks since boot, a cgroup's task
    count): a candidate reads its own /proc/self, /proc/cpuinfo, /proc/meminfo and the CPU
    list, and nothing else there."""
    code = ("import os\n\ndef policy(contexts, history, t, state):\n"
            "    if t == 0:\n        seen = {}\n"
            "        for p in ('/proc/self/status', '/proc/cpuinfo', '/proc/meminfo',\n"
            "                  '/sys/devices/system/cpu/online', '/proc/stat', '/proc/loadavg',\n"
            "                  '/proc/vmstat', '/sys/fs/cgroup/pids.current',\n"
            "                  '/sys/kernel/mm/transparent_hugepage/enabled'):\n"
            "            try:\n                open(p).read()\n                seen[p] = True\n"
            "            except OSError:\n                seen[p] = False\n"
            "        raise ValueError((sorted(k for k, v in seen.items() if v), os.cpu_count() > 0))\n"
            "    return 0\n")
    with _toy(mode, workers=1) as sb:
        ev = sb.evaluate(code, {})
    assert ev.message == ("ValueError (line 15): (['/proc/cpuinfo', '/proc/meminfo', "
                          "'/proc/self/status', '/sys/devices/system/cpu/online'], True)"), ev
