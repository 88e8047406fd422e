"""The PINN task's training and validation: never runs candidate Python in the trainer.

``make_evaluator(config)`` runs once per process: it builds the compiled network /
derivative / Adam functions (``model.Trainer``) and compiles them on the worker's shapes.
Per candidate, ``export`` (the candidate's side: the sandbox runner) loads the program and
exports ``value_and_grad`` of its loss w.r.t. (residuals, ic_err, bc_err) as StableHLO
(``loss_export``); ``load`` (the trusted side) checks that module and compiles it, the only
new compilation per candidate; ``train_exported`` trains with it. A candidate that uses
Python control flow on traced values cannot be exported: it fails with a message that
points to ``jnp.where``.

Scores (higher is better): ``composite`` (default) = -(val_pde + val_ic + val_bc), an
unweighted validation loss fixed by us, so scaling the loss cannot win; ``paper`` = the
candidate's own loss on the validation points (paper B.2.2, gameable: ``1e-9 * loss``);
``rel_l2`` = -relative L2 error against the Cole-Hopf solution.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.tasks.pinn import loss_export
from atlas.tasks.pinn.exact import exact_grid
from atlas.tasks.pinn.problem import (
    PinnConfig,
    init_params,
    regime_draw,
    training_points,
    validation_points,
    viscosity,
)
from atlas.types import Evaluation, FailureKind

ENTRY_POINT = "pinn_loss_strategy"
#: XLA options for compiling the candidate's function (the trainer keeps full optimisation)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
#: how often (in steps) the loop checks the on-device "non-finite seen" flag
CHECK_EVERY = 50


def _setup_jax(cfg: PinnConfig, write: bool = True) -> None:
    """CPU-only defaults that also work under bubblewrap (read-only FS, no network).

    ``write=False`` (a candidate's runner) reads the persistent compilation cache that the
    trusted scorer filled and never writes to it.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    cache = cfg.compilation_cache_dir
    if cache:  # optional: only if the directory is usable
        try:
            if write:
                os.makedirs(cache, exist_ok=True)
            if os.access(cache, os.W_OK if write else os.R_OK):
                jax.config.update("jax_compilation_cache_dir", cache)
                # the worker's functions compile in well under JAX's 1 s default threshold
                jax.config.update("jax_persistent_cache_min_compile_time_secs",
                                  0.0 if write else 1e9)
        except OSError:
            pass


def _supported_options(options: dict[str, Any]) -> dict[str, Any] | None:
    """``options`` if this jaxlib compiles with them (checked once per worker), else None."""
    import jax
    import jax.numpy as jnp

    try:
        jax.block_until_ready(jax.jit(lambda x: x + 1, compiler_options=options)(jnp.zeros(2)))
        return options
    except Exception:  # noqa: BLE001 - an option unknown to this jaxlib
        return None


#: the metrics ``validation`` computes from the trained network alone: PinnTask's quality
#: metrics, so a scored program always reports each (non-finite ones fail it)
VALIDATION_METRICS = ("val_pde", "val_ic", "val_bc", "val_loss", "rel_l2")


class PinnEvaluator:
    """Callable ``(code, context) -> Evaluation``; one instance per worker process."""

    fork_safe = False  # JAX runs threads: a process that imported it must not fork

    def __init__(self, config: dict[str, Any], validation: bool = True,
                 cache_write: bool = True, compile: bool = True) -> None:
        self.cfg = PinnConfig.from_dict(dict(config))
        _setup_jax(self.cfg, cache_write)
        import jax
        import jax.numpy as jnp

        from atlas.tasks.pinn import model  # deferred: JAX, after its settings above

        self.jax, self.jnp, self.model = jax, jnp, model
        self.trainer = model.get_trainer(self.cfg)
        self._exact: OrderedDict[float, np.ndarray] = OrderedDict()
        tt, xx = np.meshgrid(np.linspace(0, 1, self.cfg.exact_nt),
                             np.linspace(-1, 1, self.cfg.exact_nx), indexing="ij")
        self.grid = (jnp.asarray(tt.ravel(), jnp.float32), jnp.asarray(xx.ravel(), jnp.float32))
        t0 = time.perf_counter()
        self.candidate_options = _supported_options(FAST_COMPILE) if compile else None
        self._signatures: dict[bool, tuple[tuple, dict[str, Any]]] = {}
        self._loaders: dict[bool, loss_export.LossLoader] | None = None
        if compile:  # an exporter (the candidate's runner) compiles nothing
            self._warm_up(validation)
        self.compile_seconds = time.perf_counter() - t0
        if self.cfg.compilation_cache_dir:
            # only the worker's own functions are worth persisting; a candidate's compile
            # must not write files while the sandbox guard watches its writes
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)

    # ------------------------------------------------------------------ helpers
    def _params(self, draw: int) -> list:
        return [(self.jnp.asarray(w), self.jnp.asarray(b))
                for w, b in init_params(self.cfg, draw)]

    def _exact_u(self, nu: float) -> np.ndarray:
        key = round(nu, 12)
        if key not in self._exact:
            self._exact[key] = exact_grid(nu, self.cfg.exact_nx, self.cfg.exact_nt)[2].ravel()
            if len(self._exact) > 8:
                self._exact.popitem(last=False)
        return self._exact[key]

    def signature(self, validation: bool = False) -> tuple[tuple, dict[str, Any]]:
        """The abstract arguments of the candidate's loss (training or validation call)."""
        key = bool(validation)
        if key not in self._signatures:
            self._signatures[key] = loss_export.signature(self.trainer, self.cfg, key)
        return self._signatures[key]

    def load_references(self) -> None:
        """Build the trusted reference exports ``load`` needs (else on first use)."""
        if self._loaders is None:
            self._loaders = {True: loss_export.LossLoader(self.signature(), True)}
        if self.cfg.score == "paper" and False not in self._loaders:
            self._loaders[False] = loss_export.LossLoader(self.signature(True), False)

    def _warm_up(self, validation: bool) -> None:
        """Compile every function of this process for its shapes (the only compilation
        besides each candidate's loss) by running the real path once with our own
        reference export: two training steps and, for a scorer, a validation."""
        self.load_references()
        assert self._loaders is not None
        loss_grad = self.jax.jit(self._loaders[True].reference.call,
                                 compiler_options=self.candidate_options)
        params, stats, _ = self.train_exported(loss_grad, {"round": 0}, steps=2)
        if validation:
            self.validation(params, viscosity(0, self.cfg), stats)

    def export(self, code: str) -> dict[str, Any]:
        """Load the program and export its loss (runs candidate code: the runner's side).

        Returns the message for ``load``: the training export (value and gradient at the
        training points) and, for ``score=paper``, the loss alone at the validation points,
        which the scorer times itself (``candidate_export_s``)."""
        jax, jnp = self.jax, self.jnp
        try:
            fn = load_candidate(code, ENTRY_POINT, {"jnp": jnp, "jax": jax, "math": math})
        except CandidateError:
            raise
        except Exception as exc:  # noqa: BLE001 - module-level code of the candidate failed
            raise CandidateError(FailureKind.EXCEPTION, loss_export._describe(exc)) from exc
        out: dict[str, Any] = {"train": loss_export.export_loss(fn, self.signature(), True)}
        if self.cfg.score == "paper":
            out["val"] = loss_export.export_loss(fn, self.signature(True), False)
        return out

    def load(self, exported: Any) -> tuple[Callable, Callable | None, float]:
        """Check and compile a runner's exports (trusted: runs no candidate Python).

        Returns (value and gradient at the training points, the loss at the validation
        points or None, compile seconds). A module that is not a plain StableHLO function
        of the task's signature is ``tampered``."""
        jax = self.jax
        if not isinstance(exported, dict):
            raise CandidateError(FailureKind.TAMPERED, "the runner sent no exported loss")
        t0 = time.perf_counter()
        self.load_references()
        assert self._loaders is not None
        fns: list[Callable | None] = []
        for grad, name in ((True, "train"), (False, "val")):
            if not grad and self.cfg.score != "paper":
                fns.append(None)
                continue
            exp = self._loaders[grad].load(exported.get(name))
            # jax.jit keeps JAX's C++ fast dispatch path; the loss is tiny, so XLA's slow
            # backend passes are skipped where this jaxlib knows the options
            fn = jax.jit(exp.call, compiler_options=self.candidate_options)
            if not grad:  # called once: compiles there
                fns.append(fn)
                continue
            vecs, extras = self.signature()
            zeros = jax.device_put(([np.zeros(v.shape, v.dtype) for v in vecs],
                                    {k: np.zeros(v.shape, v.dtype) for k, v in extras.items()}),
                                   jax.devices()[0])  # committed, as in training
            try:
                jax.block_until_ready(fn(*zeros[0], zeros[1]))
            except Exception as exc:  # noqa: BLE001 - it passed the checks: report it
                raise CandidateError(FailureKind.EXCEPTION, f"the exported loss could not be "
                                     f"compiled: {loss_export._describe(exc)}") from exc
            fns.append(fn)
        return fns[0], fns[1], time.perf_counter() - t0

    # ------------------------------------------------------------------ main
    def train_exported(self, loss_grad: Callable, context: dict[str, Any],
                       steps: int | None = None) -> tuple[list, np.ndarray, dict[str, float]]:
        """Train a fresh network with a loaded loss (no candidate Python runs here).

        Returns (trained params, training statistics, metrics of the training itself:
        timing, the candidate's own training terms)."""
        jnp, model, cfg = self.jnp, self.model, self.cfg
        nu_value = _viscosity(context, cfg)
        draw = regime_draw(nu_value)  # the regime's points and initial weights, not the round's
        # everything committed to the device from the start, like the exported loss's
        # outputs, so each trainer function has one compiled variant (warmed at start)
        params, train, nu, stats0, n_steps, bad, step = self.jax.device_put(
            (self._params(draw), model.to_device(training_points(cfg, draw)),
             jnp.float32(nu_value), model.init_stats(), jnp.int32(cfg.n_steps),
             jnp.int32(-1), jnp.int32(0)), self.jax.devices()[0])
        opt_state = self.jax.device_put(self.trainer.init_opt(params), self.jax.devices()[0])
        vecs, extras, stats = self.trainer.observe(params, train, nu, stats0, step, n_steps)
        t0 = time.perf_counter()
        try:
            for k in range(cfg.n_steps if steps is None else steps):
                loss, cots = loss_grad(*vecs, extras)
                params, opt_state, bad, step, vecs, extras, stats = self.trainer.step(
                    params, opt_state, train, nu, cots, loss, bad, stats, step, n_steps)
                if (k + 1) % CHECK_EVERY == 0 and int(bad) >= 0:
                    break
            bad_step = int(bad)
        except Exception as exc:  # noqa: BLE001 - an XLA runtime error of the loss
            raise CandidateError(FailureKind.EXCEPTION, loss_export._describe(exc)) from exc
        train_seconds = time.perf_counter() - t0
        if bad_step >= 0:
            raise CandidateError(FailureKind.NON_FINITE,
                                 f"the loss or its gradient was not finite at step {bad_step} "
                                 f"(nu={nu_value:.4g}); guard divisions and logs with an eps")
        train_stats = np.asarray(stats)
        metrics = {"candidate_jit": 1.0, "train_s": train_seconds, "steps": float(cfg.n_steps)}
        for k, c in enumerate(model.COMPONENTS):
            metrics[f"train_{c}"] = float(train_stats[k, 0])
            metrics[f"train_{c}_max"] = float(train_stats[k, 5])
        return params, train_stats, metrics

    def score_exported(self, exported: Any, context: dict[str, Any],
                       secret_key: int | None = None, start: float | None = None,
                       export_s: float | None = None) -> Evaluation:
        """Load, train, validate and score a runner's exports (trusted side). ``export_s``
        is the export's duration as this side measured it: nothing the runner sends becomes
        a metric."""
        start = time.perf_counter() if start is None else start
        loss_grad, own_fn, compile_s = self.load(exported)
        params, train_stats, metrics = self.train_exported(loss_grad, context)
        nu_value = _viscosity(context, self.cfg)
        val_metrics, vecs, extras = self.validation(params, nu_value, train_stats, secret_key)
        metrics.update(val_metrics, viscosity=nu_value, candidate_compile_s=compile_s)
        if export_s is not None:
            metrics["candidate_export_s"] = float(export_s)
        if own_fn is not None:  # score=paper: the candidate's own loss on validation points
            try:
                own = float(np.asarray(own_fn(*vecs, extras)).reshape(()))
            except Exception as exc:  # noqa: BLE001 - an XLA runtime error of the loss
                raise CandidateError(FailureKind.EXCEPTION,
                                     loss_export._describe(exc)) from exc
            if not math.isfinite(own):
                raise CandidateError(FailureKind.NON_FINITE,
                                     f"the candidate's own validation loss is {own!r}")
            if own < 0:
                raise CandidateError(FailureKind.TAMPERED,
                                     f"the candidate's own validation loss is {own} < 0: "
                                     f"outside the score's range (a loss is >= 0)")
            metrics["own_val_loss"] = own
        return self.finish(metrics, start)

    def __call__(self, code: str, context: dict[str, Any]) -> Evaluation:
        """Export and score in this process: for trusted code only (tests, benchmarks); the
        sandbox splits this between the runner (``export``) and the scorer (the rest)."""
        start = time.perf_counter()
        exported = self.export(code)
        return self.score_exported(exported, context, start=start,
                                   export_s=time.perf_counter() - start)

    def validation(self, params: list, nu_value: float, train_stats: np.ndarray,
                   secret_key: int | None = None
                   ) -> tuple[dict[str, float], tuple, dict[str, Any]]:
        """Fixed unweighted validation losses and rel. L2 vs Cole-Hopf from trained params
        (no candidate code), plus the validation residuals and extras (at the final training
        statistics) on which the candidate's own loss is the paper's score."""
        jnp, model, cfg = self.jnp, self.model, self.cfg
        nu = jnp.float32(nu_value)
        val = model.to_device(validation_points(cfg, nu_value, secret_key))
        n_steps = jnp.int32(cfg.n_steps)
        vecs, _, val_stats = self.trainer.observe(params, val, nu, model.init_stats(),
                                                  jnp.int32(0), n_steps)
        mses = [float(m) for m in np.asarray(val_stats)[:, 0]]
        u = np.asarray(self.trainer.predict(params, *self.grid), np.float64)
        exact = self._exact_u(float(nu))
        rel = float(np.linalg.norm(u - exact) / np.linalg.norm(exact))
        metrics = {"val_pde": mses[0], "val_ic": mses[1], "val_bc": mses[2],
                   "val_loss": sum(mses), "rel_l2": rel}
        extras = self.trainer.extras(jnp.asarray(train_stats, jnp.float32), n_steps, n_steps,
                                     nu, val)
        return metrics, vecs, extras

    def finish(self, metrics: dict[str, float], start: float) -> Evaluation:
        """The score the config asks for, from complete metrics."""
        cfg = self.cfg
        if cfg.score == "composite":
            score = -metrics["val_loss"]
        elif cfg.score == "rel_l2":
            score = -metrics["rel_l2"]
        else:
            if "own_val_loss" not in metrics:
                raise CandidateError(FailureKind.NON_FINITE,
                                     "the candidate's loss on the validation points is not a "
                                     "finite number (score=paper needs it)")
            score = -metrics["own_val_loss"]
        if not math.isfinite(score):
            raise CandidateError(FailureKind.NON_FINITE, f"score is not finite ({score})")
        for key in VALIDATION_METRICS:  # the declared quality metrics: never dropped
            if not math.isfinite(float(metrics[key])):
                raise CandidateError(FailureKind.NON_FINITE, f"the trained network's {key} is "
                                     f"{float(metrics[key])} (not finite)")
        metrics = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        return Evaluation(score=float(score), passed=True, metrics=metrics,
                          seconds=time.perf_counter() - start)


def _viscosity(context: dict[str, Any], cfg: PinnConfig) -> float:
    nu_value = float(context.get("viscosity", viscosity(int(context.get("round", 0)), cfg)))
    if not nu_value > 0:
        raise ValueError(f"context['viscosity'] must be > 0, got {nu_value!r}")
    return nu_value


def make_evaluator(config: dict[str, Any]) -> PinnEvaluator:
    """Factory the sandbox worker calls once; compiles the network functions eagerly."""
    evaluator = PinnEvaluator(config)
    evaluator.fork_safe = False
    return evaluator
