"""``experiment=study``: the seed study's config (issue 14), and that a seed changes the problem.

Why: under ``-m`` the jobs of a sweep share one task secret, and the bandit's hidden
environments are derived from that secret and ``task.env_seeds`` alone (PINN's training points
and initial network from ``task.seed``), so without the study's per-seed secret and
``task.seed: ${seed}`` seeds 0-4 would face one problem and differ only in sampling.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from atlas.config import validate
from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.sandbox.secret import run_secret
from atlas.tasks.bandit.evaluator import build_envs
from atlas.tasks.pinn.problem import PinnConfig, init_params, training_points
from tests.conftest import compose_cfg

METHODS = ("evotune", "evodpo", "atlas")


@pytest.mark.parametrize("task", ["bandit", "pinn"])
def test_study_has_four_phases_and_one_budget_for_every_method(task: str) -> None:
    cfgs = {m: compose_cfg(["experiment=study", f"task={task}", f"method={m}", "seed=3"])
            for m in METHODS}
    for cfg in cfgs.values():
        validate(cfg)
        ex = cfg.explore
        assert cfg.experiment_name == "study"
        assert ex.rounds // ex.phase_every >= 4  # the reference is promoted and reused 3 times
        assert ex.islands_per_round * ex.phase_every >= 2  # ATLAS's gate holds out one prompt
    # equal evaluated-candidate budgets: exploration and DPO settings identical across methods
    budget = {m: OmegaConf.to_container(c.explore, resolve=True) for m, c in cfgs.items()}
    assert budget["evotune"] == budget["evodpo"] == budget["atlas"]
    assert len({c.dpo.max_pairs for c in cfgs.values()}) == 1
    ex = cfgs["atlas"].explore
    assert ex.rounds * ex.islands_per_round * ex.samples_per_prompt == 32


def test_study_secret_is_per_seed_and_shared_by_the_methods_of_a_seed() -> None:
    files = {(m, s): compose_cfg(["experiment=study", "task=bandit", f"method={m}", f"seed={s}"])
             .sandbox.secret_file for m in METHODS for s in (0, 1)}
    assert files[("evotune", 0)] == files[("atlas", 0)] == "multirun/study/.task_secret_s0"
    assert files[("evotune", 1)] == files[("evodpo", 1)] != files[("evotune", 0)]
    # outside the study a sweep keeps one secret for all seeds (sweep_secret_file)
    assert compose_cfg(["task=bandit", "seed=1"]).sandbox.secret_file is None


def test_a_study_seed_changes_the_bandit_environments_not_the_methods(tmp_path: Path) -> None:
    cfg = compose_cfg(["experiment=study", "task=bandit"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    shared = {s: tmp_path / f"multirun/study/.task_secret_s{s}" for s in (0, 1)}
    secrets = {(m, s): run_secret(tmp_path / f"bandit_{m}_s{s}", str(shared[s]),
                                     create=True)
               for m in ("evotune", "atlas") for s in (0, 1)}
    assert secrets[("evotune", 0)] == secrets[("atlas", 0)] != secrets[("evotune", 1)]
    envs = {s: build_envs(task, secrets[("atlas", s)]) for s in (0, 1)}
    same = build_envs(task, secrets[("evotune", 0)])
    assert all(np.array_equal(a.thetas, b.thetas) for a, b in zip(envs[0], same))
    assert not any(np.array_equal(a.thetas, b.thetas) for a, b in zip(envs[0], envs[1]))
    assert [e.seed for e in envs[1]] == list(task["env_seeds"])  # public labels unchanged


def test_a_seed_changes_the_pinn_points_and_initial_network() -> None:
    tasks = {s: OmegaConf.to_container(compose_cfg(["experiment=study", "task=pinn", f"seed={s}"])
                                       .task, resolve=True) for s in (0, 1)}
    assert (tasks[0]["seed"], tasks[1]["seed"]) == (0, 1)
    cfgs = {s: PinnConfig.from_dict({k: v for k, v in t.items() if k != "name"})
            for s, t in tasks.items()}
    assert not np.array_equal(training_points(cfgs[0], 1).x_f, training_points(cfgs[1], 1).x_f)
    assert not np.array_equal(init_params(cfgs[0], 1)[0][0], init_params(cfgs[1], 1)[0][0])
    assert np.array_equal(training_points(cfgs[1], 1).x_f,
                          training_points(PinnConfig.from_dict(cfgs[1].to_dict()), 1).x_f)


def test_sandbox_masks_a_relative_secret_path_by_its_absolute_name(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the study's secret_file is relative; the runner resolves hidden paths after chdir
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "multirun" / "study" / ".task_secret_s0"
    secret.parent.mkdir(parents=True)
    secret.write_text("5eed" * 16)
    sb = Sandbox(TaskSpec("atlas.tasks.bandit.evaluator:make_scorer", {},
                          "atlas.tasks.bandit.evaluator:make_runner"),
                 resources=Resources(workers=1),
                 confinement=Confinement(hide=("multirun/study/.task_secret_s0",)))
    try:  # masked by its absolute name, with the whole output tree it lies in
        real = os.path.realpath(secret)
        assert sb.hide and all(os.path.isabs(h) for h in sb.hide)
        assert any(real == h or real.startswith(h + os.sep) for h in sb.hide)
    finally:
        sb.close()
