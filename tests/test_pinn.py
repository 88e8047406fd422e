"""PINN task: exact solution, schedule, compiled evaluator, failure classes, scoring integrity."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from atlas.sandbox.candidate import CandidateError
from atlas.tasks import make_task
from atlas.tasks.pinn import SEED_PROGRAM, PinnTask
from atlas.tasks.pinn.exact import burgers_cole_hopf, exact_grid, solve_fd
from atlas.tasks.pinn.problem import PinnConfig, regime_draw, training_points, viscosity
from atlas.types import FailureKind

SMALL = {"name": "pinn", "n_steps": 150, "n_collocation": 256, "n_initial": 64,
         "n_boundary": 64, "n_val_collocation": 512, "n_val_initial": 128,
         "n_val_boundary": 128, "exact_nx": 128, "exact_nt": 51}
CTX = {"round": 0, "viscosity": 0.1 / math.pi}

UNWEIGHTED = """def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    return jnp.mean(residuals ** 2) + jnp.mean(ic_err ** 2) + jnp.mean(bc_err ** 2)
"""
SCALED = """def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    return 1e-9 * (jnp.mean(residuals ** 2) + jnp.mean(ic_err ** 2) + jnp.mean(bc_err ** 2))
"""


def strategy(body: str) -> str:
    return "def pinn_loss_strategy(residuals, ic_err, bc_err, extras):\n" + body


@pytest.fixture(scope="module")
def evaluator():
    from atlas.tasks.pinn.evaluator import make_evaluator

    return make_evaluator(SMALL)


# ----------------------------------------------------------------------------- exact solution
def test_cole_hopf_properties():
    nu = 0.01 / math.pi
    x = np.linspace(-1, 1, 201)
    for t in (0.0, 0.3, 1.0):
        u = burgers_cole_hopf(t, x, nu)
        np.testing.assert_allclose(u, -u[::-1], atol=1e-9)  # odd in x
        assert abs(u[0]) < 1e-9 and abs(u[-1]) < 1e-9  # u(t, +-1) = 0
    np.testing.assert_allclose(burgers_cole_hopf(0.0, x, nu), -np.sin(np.pi * x), atol=1e-12)


def test_cole_hopf_front_slope_matches_literature():
    # Basdevant et al. (1986): for nu = 0.01/pi, max |u_x| = 152.00516 at x=0, t=1.6037/pi
    h, t = 1e-6, 1.6037 / math.pi
    slope = (burgers_cole_hopf(t, h, 0.01 / math.pi) - burgers_cole_hopf(t, -h, 0.01 / math.pi))
    assert float(slope) / (2 * h) == pytest.approx(-152.00516, rel=1e-6)
    smooth = burgers_cole_hopf(t, h, 0.1 / math.pi) - burgers_cole_hopf(t, -h, 0.1 / math.pi)
    assert abs(float(smooth) / (2 * h)) < 15  # ten times flatter: no front in the viscous regime


@pytest.mark.parametrize("nu,nx,tol", [(0.1 / math.pi, 801, 1e-4), (0.01 / math.pi, 2001, 3e-4)])
def test_cole_hopf_matches_finite_differences(nu, nx, tol):
    x, snaps = solve_fd(nu, nx=nx, times=(0.5, 1.0))
    for t, u in snaps.items():
        exact = burgers_cole_hopf(t, x, nu)
        assert np.linalg.norm(exact - u) / np.linalg.norm(u) < tol


def test_quadrature_rejects_bad_input():
    with pytest.raises(ValueError, match="nu"):
        burgers_cole_hopf(0.5, 0.0, 0.0)
    with pytest.raises(ValueError, match="n_quad"):
        exact_grid(0.01, n_quad=1)


# ----------------------------------------------------------------------------- problem / task
def test_viscosity_schedules():
    cfg = PinnConfig(drift_rounds=10, hold_rounds=None)  # a new nu every round
    nus = [viscosity(r, cfg) for r in range(15)]
    assert nus[0] == pytest.approx(0.1 / math.pi) and nus[10] == pytest.approx(0.01 / math.pi)
    assert all(a > b for a, b in zip(nus[:10], nus[1:11])) and nus[14] == nus[10]
    assert nus[5] == pytest.approx(math.sqrt(nus[0] * nus[10]))  # geometric midpoint
    cos = PinnConfig(schedule="cosine", drift_rounds=10, hold_rounds=None)
    assert viscosity(10, cos) == pytest.approx(0.01 / math.pi)
    assert viscosity(20, cos) == pytest.approx(0.1 / math.pi)  # the regime comes back
    assert viscosity(7, PinnConfig(schedule="constant")) == pytest.approx(0.1 / math.pi)


def test_viscosity_held_per_phase_still_drifts_to_the_shock():
    """Default: nu steps only at phase boundaries (rounds 1-4, 5-8 with phase_every=4), the
    seed's round 0 shares phase 1's nu, and the last phase is in the shock regime."""
    cfg = PinnConfig(drift_rounds=8, hold_rounds=4)
    nus = [viscosity(r, cfg) for r in range(9)]
    assert nus[:5] == [pytest.approx(0.1 / math.pi)] * 5
    assert nus[5:] == [pytest.approx(0.01 / math.pi)] * 4
    three = [viscosity(r, PinnConfig(drift_rounds=12, hold_rounds=4)) for r in (1, 5, 9, 12)]
    assert three[0] > three[1] > three[2] == three[3] == pytest.approx(0.01 / math.pi)
    assert three[1] == pytest.approx(math.sqrt(three[0] * three[2]))
    assert viscosity(9, PinnConfig(drift_rounds=4, hold_rounds=8)) == pytest.approx(0.1 / math.pi)
    with pytest.raises(ValueError, match="hold_rounds"):
        PinnConfig(hold_rounds=0)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="task.schedule"):
        PinnConfig(schedule="linear")
    with pytest.raises(ValueError, match="task.n_steps"):
        PinnTask(name="pinn", n_steps=0)
    with pytest.raises(ValueError, match=r"unknown task field.*viscosity"):
        PinnTask(name="pinn", viscosity=0.1)
    with pytest.raises(TypeError, match=r"task\.depth must be an integer, got 3\.5"):
        PinnConfig(depth=3.5)
    with pytest.raises(TypeError, match=r"task\.lr must be a number, got 'fast'"):
        PinnConfig(lr="fast")
    with pytest.raises(ValueError, match=r"task\.stats_decay=1\.0 is invalid"):
        PinnConfig(stats_decay=1.0)
    assert PinnConfig(n_steps=20.0).n_steps == 20 and isinstance(PinnConfig(n_steps=20.0).n_steps, int)


def test_task_from_yaml_and_contract():
    from tests.conftest import compose_cfg

    cfg = OmegaConf.to_container(compose_cfg(["task=pinn"]).task, resolve=True)
    assert cfg["drift_rounds"] == compose_cfg().explore.rounds  # drifts over the whole run
    task = make_task(**cfg)
    assert isinstance(task, PinnTask) and task.name == "pinn"
    assert task.evaluator_factory == "atlas.tasks.pinn.split:make_scorer"
    assert task.runner_factory == "atlas.tasks.pinn.split:make_runner"
    assert task.settings == PinnConfig()  # yaml and dataclass defaults agree
    ctx = task.context(8)
    assert json.loads(json.dumps(ctx)) == ctx and ctx["viscosity"] == pytest.approx(0.01 / math.pi)
    spec = task.prompt_spec()
    assert spec.entry_point == "pinn_loss_strategy" and "extras" in spec.problem
    assert "def pinn_loss_strategy" in task.seed_program()


def test_points_are_fixed_per_draw():
    cfg = PinnConfig()
    a, b, c = training_points(cfg, 3), training_points(cfg, 3), training_points(cfg, 4)
    np.testing.assert_array_equal(a.x_f, b.x_f)
    assert not np.array_equal(a.x_f, c.x_f)
    assert a.t_f.min() >= 0 and a.t_f.max() <= 1 and set(np.unique(a.x_b)) == {-1.0, 1.0}


# ----------------------------------------------------------------------------- compiled model
def test_taylor_derivatives_match_autodiff():
    import jax
    import jax.numpy as jnp

    from atlas.tasks.pinn import model
    from atlas.tasks.pinn.problem import init_params

    params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in init_params(PinnConfig(), 0)]
    t, x = jnp.linspace(0, 1, 64), jnp.linspace(-1, 1, 64)

    def u(ti, xi):
        return model.mlp(params, ti[None], xi[None])[0]

    @jax.jit
    def autodiff(t, x):
        return (jax.vmap(jax.grad(u, 0))(t, x), jax.vmap(jax.grad(u, 1))(t, x),
                jax.vmap(jax.grad(jax.grad(u, 1), 1))(t, x))

    ours = jax.jit(model.mlp_derivatives)(params, t, x)[1:]
    for got, want in zip(ours, autodiff(t, x)):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_chunked_residuals_equal_one_pass(monkeypatch, n):
    import jax.numpy as jnp

    from atlas.tasks.pinn import model
    from atlas.tasks.pinn.problem import init_params

    cfg = PinnConfig(n_collocation=n)
    params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in init_params(cfg, 0)]
    pts = model.to_device(training_points(cfg, 0))
    chunked = model.residuals(params, pts, jnp.float32(0.01))
    monkeypatch.setattr(model, "COLLOCATION_CHUNKS", 1)
    whole = model.residuals(params, pts, jnp.float32(0.01))
    assert chunked[0].shape == (n,)
    for got, want in zip(chunked, whole):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_running_statistics():
    import jax.numpy as jnp

    from atlas.tasks.pinn import model

    seq = [4.0, 2.0, 3.0]
    stats = model.init_stats()
    ema = ema_sq = None
    for k, m in enumerate(seq):
        stats = model.update_stats(stats, jnp.full(3, m), jnp.int32(k), 0.5)
        ema = m if ema is None else 0.5 * ema + 0.5 * m
        ema_sq = m * m if ema_sq is None else 0.5 * ema_sq + 0.5 * m * m
    pts = model.to_device(training_points(PinnConfig(n_collocation=8), 0))
    ex = model.extras_from(stats, jnp.int32(2), 10, jnp.float32(0.1), pts)
    assert float(ex["ic_ema"]) == pytest.approx(ema) and float(ex["ic_mse"]) == 3.0
    assert float(ex["pde_std"]) == pytest.approx(math.sqrt(ema_sq - ema ** 2), rel=1e-5)
    assert (float(ex["bc_init"]), float(ex["bc_min"]), float(ex["bc_max"])) == (4.0, 2.0, 4.0)
    assert float(ex["progress"]) == pytest.approx(0.2) and ex["x"].shape == (8,)


# ----------------------------------------------------------------------------- evaluator
def test_seed_program_trains_and_reports_metrics(evaluator):
    assert evaluator.fork_safe is False
    ev = evaluator(SEED_PROGRAM, CTX)
    assert ev.passed and ev.failure_kind == FailureKind.OK.value
    m = ev.metrics
    for key in ("val_pde", "val_ic", "val_bc", "val_loss", "rel_l2", "viscosity",
                "train_ic_max", "candidate_compile_s", "candidate_export_s"):
        assert key in m and math.isfinite(m[key])
    assert "own_val_loss" not in m  # only score=paper evaluates the candidate's own loss
    assert ev.score == pytest.approx(-m["val_loss"])
    assert m["val_loss"] == pytest.approx(m["val_pde"] + m["val_ic"] + m["val_bc"])
    assert m["candidate_jit"] == 1.0 and m["viscosity"] == pytest.approx(CTX["viscosity"])
    assert m["rel_l2"] < 0.8  # 150 steps already move away from the zero solution (1.0)
    assert m["train_ic"] < 0.5 * m["train_ic_max"]  # the initial error was reduced
    again = evaluator(SEED_PROGRAM, CTX)
    assert again.score == ev.score  # deterministic: same round, same code


def test_ignoring_the_initial_condition_shows_an_ic_spike(evaluator):
    seed = evaluator(SEED_PROGRAM, CTX).metrics
    pde_only = evaluator(strategy("    return jnp.mean(residuals ** 2)\n"), CTX).metrics
    assert pde_only["val_pde"] < seed["val_pde"]  # trivial solution: residual looks great
    assert pde_only["val_ic"] > 10 * seed["val_ic"]  # ... the per-component metric exposes it


def test_python_control_flow_fails_and_points_to_jnp_where(evaluator):
    from atlas.tasks.pinn.evaluator import make_evaluator

    short = make_evaluator({**SMALL, "n_steps": 20})  # shares the compiled functions
    code = strategy("    w = 10.0 if extras['step'] < 10 else 1.0\n"
                    "    return jnp.mean(residuals ** 2) + w * jnp.mean(ic_err ** 2)"
                    " + jnp.mean(bc_err ** 2)\n")
    # the loss is exported (compiled) where it runs and trained elsewhere: no eager fallback
    with pytest.raises(CandidateError) as info:
        short(code, CTX)
    assert info.value.kind == FailureKind.EXCEPTION and "jnp.where" in info.value.message
    # the same schedule written with jnp.where is exported and trains
    jitted = short(code.replace("10.0 if extras['step'] < 10 else 1.0",
                                "jnp.where(extras['step'] < 10, 10.0, 1.0)"), CTX)
    assert jitted.passed and jitted.metrics["steps"] == 20


@pytest.mark.parametrize("body,text", [
    # a callback on a value without gradient (stop_gradient: no JVP needed) reaches export
    ("    w = jax.pure_callback(lambda p: p, jax.ShapeDtypeStruct((), jnp.float32),\n"
     "                          extras['progress'])\n"
     "    return w * jnp.mean(residuals ** 2) + jnp.mean(ic_err ** 2)\n",
     "no Python callbacks in the loss"),
    ("    jax.debug.print('r0 {}', residuals[0])\n    return jnp.mean(residuals ** 2)\n",
     "no Python callbacks in the loss"),
    ("    w = jax.pure_callback(lambda p: p, jax.ShapeDtypeStruct((), jnp.float32), 1.0)\n"
     "    return w * jnp.mean(residuals ** 2)\n", "no Python callbacks in the loss"),
    # a library kernel (LAPACK custom_call) is not plain StableHLO: refused with the reason
    ("    m = jnp.outer(ic_err[:4], ic_err[:4]) + jnp.eye(4)\n"
     "    return jnp.linalg.eigh(m)[0].sum() + jnp.mean(residuals ** 2)\n",
     "stablehlo.custom_call"),
])
def test_what_cannot_be_exported_fails_clearly(evaluator, body, text):
    with pytest.raises(CandidateError) as info:
        evaluator(strategy(body), CTX)
    assert info.value.kind == FailureKind.EXCEPTION and text in info.value.message, info.value


def test_scorer_rejects_forged_exports(evaluator):
    """The module is data from an untrusted process: only a plain StableHLO function of the
    task's signature is compiled; everything else is ``tampered``."""
    import base64

    import jax
    import jax.numpy as jnp

    from atlas.tasks.pinn import loss_export

    honest = evaluator.export(SEED_PROGRAM)
    evaluator.load(honest)  # accepted
    sig = evaluator.signature()

    def forged(**change):
        return {**honest, "train": {**honest["train"], **change}}

    def kernel(r, i, b, e):  # a LAPACK custom_call the runner-side check would refuse
        return jnp.linalg.eigh(jnp.outer(i[:4], i[:4]) + jnp.eye(4))[0].sum() + jnp.mean(r * r)

    exp = jax.export.export(jax.jit(loss_export.loss_function(kernel, True)))(*sig[0], sig[1])
    other = evaluator.signature(validation=True)  # the right code at the wrong shapes
    wrong = jax.export.export(jax.jit(loss_export.loss_function(
        lambda r, i, b, e: jnp.mean(r * r), True)))(*other[0], other[1])
    cases = {
        "custom_call": forged(module=base64.b64encode(exp.mlir_module_serialized).decode(),
                              kept=list(exp.module_kept_var_idx)),
        "signature": forged(module=base64.b64encode(wrong.mlir_module_serialized).decode(),
                            kept=list(wrong.module_kept_var_idx)),
        "main function": forged(module=base64.b64encode(b"\x00" * 64).decode()),
        "not base64": forged(module="%%%"),
        "invalid arguments": forged(kept=[0, 0, 1]),
        "missing": {**honest, "train": None},
    }
    for text, msg in cases.items():
        with pytest.raises(CandidateError) as info:
            evaluator.load(msg)
        assert info.value.kind == FailureKind.TAMPERED and text in info.value.message, (
            text, info.value.message)
    # the training export keeps the arguments it reads; claiming others mismatches the module
    with pytest.raises(CandidateError) as info:
        evaluator.load(forged(kept=list(range(len(honest["train"]["kept"]) + 1))))
    assert info.value.kind == FailureKind.TAMPERED


@pytest.mark.parametrize("body,kind,text", [
    ("    return jnp.log(jnp.mean(residuals ** 2) - 10.0)\n", FailureKind.NON_FINITE, "step 0"),
    ("    return residuals ** 2\n", FailureKind.WRONG_RETURN, "shape (256,)"),
    ("    return jnp.sum(residuals > 0)\n", FailureKind.WRONG_RETURN, "dtype"),
    ("    return None\n", FailureKind.WRONG_RETURN, "NoneType"),
    ("    return extras['weight'] * jnp.mean(residuals ** 2)\n", FailureKind.EXCEPTION,
     "KeyError"),
    ("    return jnp.mean(residuals ** 2 +\n", FailureKind.SYNTAX_ERROR, "SyntaxError"),
    ("    return jnp.mean(residuals ** 2) / 0.0 * 0.0\n", FailureKind.NON_FINITE, "not finite"),
])
def test_failures_are_classified(evaluator, body, kind, text):
    with pytest.raises(CandidateError) as info:
        evaluator(strategy(body), CTX)
    assert info.value.kind == kind and text in info.value.message


def test_missing_entry_point(evaluator):
    with pytest.raises(CandidateError) as info:
        evaluator("def loss(a, b, c, d):\n    return 0.0\n", CTX)
    assert info.value.kind == FailureKind.MISSING_ENTRY_POINT


def test_scaled_loss_games_the_paper_score_only(evaluator):
    from atlas.tasks.pinn.evaluator import make_evaluator

    plain, scaled = evaluator(UNWEIGHTED, CTX), evaluator(SCALED, CTX)
    # default score: fixed unweighted validation loss; scaling the loss gains nothing
    assert scaled.score <= plain.score + 1e-6
    paper = make_evaluator({**SMALL, "score": "paper"})  # shares the compiled functions
    p_plain, p_scaled = paper(UNWEIGHTED, CTX), paper(SCALED, CTX)
    assert p_scaled.score > p_plain.score  # the paper's score rewards the rescaling
    assert p_scaled.score > -1e-6 and p_plain.score == pytest.approx(-plain.metrics["val_loss"],
                                                                       rel=1e-4)


def test_jax_evaluator_matches_torch_reference(evaluator):
    from atlas.tasks.pinn.torch_reference import TorchNumpy, torch_train

    code = strategy("    pde = jnp.mean(residuals ** 2) / (extras['pde_ema'] + 1e-8)\n"
                    "    return pde + jnp.mean(ic_err ** 2) + jnp.mean(bc_err ** 2)\n")
    cfg = PinnConfig(**{**SMALL, "n_steps": 30})
    ns = {"jnp": TorchNumpy}
    exec(code, ns)  # noqa: S102 - trusted test code
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: extra threads only contend with other processes
    try:
        ref = torch_train(ns["pinn_loss_strategy"], cfg,
                          training_points(cfg, regime_draw(CTX["viscosity"])), CTX["viscosity"])
    finally:
        torch.set_num_threads(threads)
    from atlas.tasks.pinn.evaluator import make_evaluator

    ours = make_evaluator({**SMALL, "n_steps": 30})(code, CTX).metrics
    for c in ("pde", "ic", "bc"):
        assert ours[f"train_{c}"] == pytest.approx(ref[f"train_{c}"], rel=2e-3)


SANDBOXED = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from atlas.tasks.pinn import SEED_PROGRAM
from atlas.tasks.pinn.evaluator import make_evaluator
ev = make_evaluator({"name": "pinn", "n_steps": 10, "n_collocation": 64,
                     "compilation_cache_dir": "/nonexistent/readonly/cache"})
print("score", ev(SEED_PROGRAM, {"round": 1}).score)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_evaluator_runs_under_bubblewrap_and_memory_limit(tmp_path):
    # the sandbox's own bwrap prefix (read-only root, private /tmp with code under /tmp bound
    # back in, no network) plus a 2 GiB address space
    from atlas.sandbox.isolation import bwrap_args, find_bwrap

    cmd = bwrap_args(str(find_bwrap()), 64) + [sys.executable, "-c", SANDBOXED]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if out.returncode != 0 and "bwrap:" in out.stderr and "score" not in out.stdout:
        pytest.skip(f"bubblewrap cannot run here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert math.isfinite(float(out.stdout.split("score")[-1]))


def test_benchmark_runs_all_loops_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "atlas.bench", "pinn", "--steps", "5",
                           "--candidates", "2", "--gap", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    for loop in "abcdsw":
        assert len(data["times_s"][loop]) == 2 and min(data["times_s"][loop]) > 0
    assert all(math.isfinite(v) for v in data["a_scores"].values())
    # the sandboxed scorer draws validation points from its own secret: finite, not equal
    assert all(math.isfinite(v) for v in data["s_scores"].values())
    assert data["d_run_s"] > 0 and data["c_over_floor"] > 0
    for label in ("(a) ours", "(b) naive", "(c) PyTorch", "(d) fused", "floor:"):
        assert label in proc.stdout


def test_candidate_compile_options_are_checked_once_and_dropped_if_unknown():
    from atlas.tasks.pinn.evaluator import FAST_COMPILE, _supported_options

    assert _supported_options(FAST_COMPILE) == FAST_COMPILE  # this jaxlib knows them
    assert _supported_options({"xla_no_such_option_for_atlas": 1}) is None


def test_a_program_scores_the_same_in_every_round_of_a_regime(evaluator):
    """Training points and initial weights follow the regime, not the round: the same
    program in two rounds at one viscosity gets one score (scores within a regime compare)."""
    code = strategy("    return jnp.mean(residuals ** 2) + jnp.mean(ic_err ** 2)"
                    " + jnp.mean(bc_err ** 2)\n")
    a = evaluator(code, {**CTX, "round": 1})
    b = evaluator(code, {**CTX, "round": 7})
    c = evaluator(code, {**CTX, "round": 7, "viscosity": CTX["viscosity"] * 2})
    untimed = [k for k in a.metrics if not k.endswith("_s")]
    assert a.passed and a.score == b.score and len(untimed) > 3
    assert all(a.metrics[k] == b.metrics[k] for k in untimed)
    assert c.score != a.score
