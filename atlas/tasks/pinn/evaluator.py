"""Worker half of the PINN task: train a fresh PINN with the candidate's loss, then score it.

``make_evaluator(config)`` runs once per sandbox worker: it builds the compiled network /
derivative / Adam functions (``model.Trainer``) and compiles them on the worker's shapes.
Per candidate the only new compilation is the candidate's own function: ``jax.jit`` of
``value_and_grad(candidate)`` w.r.t. (residuals, ic_err, bc_err). A candidate that uses
Python control flow on traced values cannot be jitted; it falls back to eager execution with
``extras`` as plain Python numbers (slower per step, same semantics).

Scores (higher is better): ``composite`` (default) = -(val_pde + val_ic + val_bc), an
unweighted validation loss fixed by us, so scaling the loss cannot win; ``paper`` = the
candidate's own loss on the validation points (paper B.2.2, gameable: ``1e-9 * loss``);
``rel_l2`` = -relative L2 error against the Cole-Hopf solution.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.tasks.pinn.exact import exact_grid
from atlas.tasks.pinn.problem import (
    PinnConfig,
    init_params,
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


def _is_tracer_error(exc: BaseException) -> bool:
    import jax

    return isinstance(exc, (jax.errors.ConcretizationTypeError,
                            jax.errors.TracerArrayConversionError,
                            jax.errors.TracerIntegerConversionError,
                            jax.errors.TracerBoolConversionError,
                            jax.errors.UnexpectedTracerError))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.split("\n\nSee https://")[0][:1500]


def _check_return(out: Any) -> None:
    """A loss must be one floating-point number (shape () or size 1)."""
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if isinstance(out, float):
        return
    if shape is None or dtype is None:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a scalar array, got "
                             f"{type(out).__name__}")
    if int(np.prod(shape)) != 1:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a scalar loss, got shape "
                             f"{tuple(shape)}; reduce with jnp.mean or jnp.sum")
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a float loss, got dtype {dtype}")


class PinnEvaluator:
    """Callable ``(code, context) -> Evaluation``; one instance per worker process."""

    fork_safe = False  # JAX runs threads: a process that imported it must not fork

    def __init__(self, config: dict[str, Any], validation: bool = True,
                 cache_write: bool = True) -> None:
        self.cfg = PinnConfig.from_dict(dict(config))
        _setup_jax(self.cfg, cache_write)
        import jax
        import jax.numpy as jnp

        from atlas.tasks.pinn import model

        self.jax, self.jnp, self.model = jax, jnp, model
        self.trainer = model.get_trainer(self.cfg)
        self._exact: OrderedDict[float, np.ndarray] = OrderedDict()
        tt, xx = np.meshgrid(np.linspace(0, 1, self.cfg.exact_nt),
                             np.linspace(-1, 1, self.cfg.exact_nx), indexing="ij")
        self.grid = (jnp.asarray(tt.ravel(), jnp.float32), jnp.asarray(xx.ravel(), jnp.float32))
        t0 = time.perf_counter()
        self.trainer.warm_up(self._params(0), model.to_device(training_points(self.cfg, 0)),
                             model.to_device(validation_points(self.cfg, 0, 0))
                             if validation else None, self.grid if validation else None)
        self.compile_seconds = time.perf_counter() - t0
        self.candidate_options = _supported_options(FAST_COMPILE)
        if self.cfg.compilation_cache_dir:
            # only the worker's own functions are worth persisting; a candidate's compile
            # must not write files while the sandbox guard watches its writes
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)

    # ------------------------------------------------------------------ helpers
    def _params(self, round_index: int) -> list:
        return [(self.jnp.asarray(w), self.jnp.asarray(b))
                for w, b in init_params(self.cfg, round_index)]

    def _exact_u(self, nu: float) -> np.ndarray:
        key = round(nu, 12)
        if key not in self._exact:
            self._exact[key] = exact_grid(nu, self.cfg.exact_nx, self.cfg.exact_nt)[2].ravel()
            if len(self._exact) > 8:
                self._exact.popitem(last=False)
        return self._exact[key]

    def _host_extras(self, extras: dict[str, Any]) -> dict[str, Any]:
        """Concrete extras for eager candidates: scalars become Python numbers (so Python
        ``if`` works), arrays stay on device; one batched transfer per step."""
        scalars = {k: v for k, v in extras.items() if np.ndim(v) == 0}
        out = {k: v for k, v in extras.items() if k not in scalars}
        for k, v in self.jax.device_get(scalars).items():
            arr = np.asarray(v)
            out[k] = int(arr) if np.issubdtype(arr.dtype, np.integer) else float(arr)
        return out

    def _compile_candidate(self, fn: Callable, vecs: tuple, extras: dict) -> tuple[Callable, bool]:
        """jit(value_and_grad(candidate)) if it traces, else an eager version (flag False)."""
        jax = self.jax

        def scalar_loss(r: Any, i: Any, b: Any, e: dict) -> Any:
            return self.jnp.reshape(fn(r, i, b, e), ())

        vg = jax.value_and_grad(scalar_loss, argnums=(0, 1, 2))
        if self.cfg.jit_candidate:
            try:
                _check_return(jax.eval_shape(fn, *vecs, extras))
                # jax.jit (not lower().compile()) keeps JAX's C++ fast dispatch path, ~100 us
                # cheaper per call; the candidate is tiny, so XLA's slow backend passes are
                # skipped (~30% faster compile) where this jaxlib knows the options
                compiled = jax.jit(vg, compiler_options=self.candidate_options)
                jax.block_until_ready(compiled(*vecs, extras))
                return compiled, True
            except CandidateError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                if not _is_tracer_error(exc):
                    raise CandidateError(FailureKind.EXCEPTION, _describe(exc)) from exc
        host = self._host_extras(extras)
        try:
            _check_return(fn(*vecs, host))
            vg(*vecs, host)
        except CandidateError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise CandidateError(FailureKind.EXCEPTION, _describe(exc)) from exc
        return (lambda r, i, b, e: vg(r, i, b, self._host_extras(e))), False

    # ------------------------------------------------------------------ main
    def train(self, code: str, context: dict[str, Any]
              ) -> tuple[Callable, list, np.ndarray, dict[str, float]]:
        """Train a fresh network with the candidate's loss (runs candidate code).

        Returns (the candidate's function, trained params, training statistics, metrics of
        the training itself: timings, jit flag, the candidate's own training terms).
        """
        jax, jnp, model, cfg = self.jax, self.jnp, self.model, self.cfg
        round_index = int(context.get("round", 0))
        nu_value = _viscosity(context, cfg)
        try:
            fn = load_candidate(code, ENTRY_POINT, {"jnp": jnp, "jax": jax, "math": math})
        except CandidateError:
            raise
        except Exception as exc:  # noqa: BLE001 - module-level code of the candidate failed
            raise CandidateError(FailureKind.EXCEPTION, _describe(exc)) from exc

        nu = jnp.float32(nu_value)
        params = self._params(round_index)
        train = model.to_device(training_points(cfg, round_index))
        opt_state = self.trainer.init_opt(params)
        n_steps = jnp.int32(cfg.n_steps)
        vecs, extras, stats = self.trainer.observe(params, train, nu, model.init_stats(),
                                                   jnp.int32(0), n_steps)
        t0 = time.perf_counter()
        loss_grad, jitted = self._compile_candidate(fn, vecs, extras)
        candidate_compile = time.perf_counter() - t0

        bad, step = jnp.int32(-1), jnp.int32(0)
        t0 = time.perf_counter()
        try:
            for k in range(cfg.n_steps):
                loss, cots = loss_grad(*vecs, extras)
                params, opt_state, bad, step, vecs, extras, stats = self.trainer.step(
                    params, opt_state, train, nu, cots, loss, bad, stats, step, n_steps)
                if (k + 1) % CHECK_EVERY == 0 and int(bad) >= 0:
                    break
            bad_step = int(bad)
        except CandidateError:
            raise
        except Exception as exc:  # noqa: BLE001 - an eager candidate can fail mid-run
            raise CandidateError(FailureKind.EXCEPTION, _describe(exc)) from exc
        train_seconds = time.perf_counter() - t0
        if bad_step >= 0:
            raise CandidateError(FailureKind.NON_FINITE,
                                 f"the loss or its gradient was not finite at step {bad_step} "
                                 f"(nu={nu_value:.4g}); guard divisions and logs with an eps")
        train_stats = np.asarray(stats)
        metrics = {"candidate_jit": float(jitted), "candidate_compile_s": candidate_compile,
                   "train_s": train_seconds, "steps": float(cfg.n_steps)}
        for k, c in enumerate(model.COMPONENTS):
            metrics[f"train_{c}"] = float(train_stats[k, 0])
            metrics[f"train_{c}_max"] = float(train_stats[k, 5])
        return fn, params, train_stats, metrics

    def __call__(self, code: str, context: dict[str, Any]) -> Evaluation:
        """Train and score in this process: for trusted code only (tests, benchmarks); the
        sandbox splits this between ``PinnRunner`` and ``PinnScorer``."""
        start = time.perf_counter()
        fn, params, train_stats, train_metrics = self.train(code, context)
        round_index, nu_value = int(context.get("round", 0)), _viscosity(context, self.cfg)
        eval_key = int(context.get("eval_key", zlib.crc32(code.encode("utf-8"))))
        metrics, vecs, extras = self.validation(params, nu_value, train_stats, round_index,
                                                eval_key)
        try:
            out = fn(*vecs, self._host_extras(extras))
            metrics["own_val_loss"] = float(np.asarray(out).reshape(()))
        except Exception:  # noqa: BLE001 - a metric; training already succeeded
            pass
        metrics.update(train_metrics, viscosity=nu_value)
        return self.finish(metrics, start)

    def validation(self, params: list, nu_value: float, train_stats: np.ndarray,
                   round_index: int, eval_key: int, secret_key: int | None = None
                   ) -> tuple[dict[str, float], tuple, dict[str, Any]]:
        """Fixed unweighted validation losses and rel. L2 vs Cole-Hopf from trained params
        (no candidate code), plus the validation residuals and extras (at the final training
        statistics) on which the candidate's own loss is the paper's score."""
        jnp, model, cfg = self.jnp, self.model, self.cfg
        nu = jnp.float32(nu_value)
        val = model.to_device(validation_points(cfg, round_index, eval_key, secret_key))
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
