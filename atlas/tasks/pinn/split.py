"""The PINN task split across the sandbox: training runs the candidate, scoring never does.

``make_runner(public_config)`` (the candidate's single-use process): imports JAX, compiles the
training functions (warm-up, before any candidate code), then trains a fresh network with the
candidate's loss and sends back the trained parameters and training statistics. With
``score=paper`` it then evaluates the candidate's own loss on residuals the scorer computed.

``make_scorer(config, secret)`` (the trusted worker, which never runs candidate code): checks
the returned parameters (shapes, finiteness), draws the validation points from the run's
secret, computes the validation losses and the relative L2 against Cole-Hopf itself, and
range-checks the candidate's own loss (paper score: a loss must be >= 0).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import zlib
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.link import Link
from atlas.sandbox.secret import derive_seed
from atlas.tasks.pinn.evaluator import PinnEvaluator, _viscosity
from atlas.types import Evaluation, FailureKind

#: training metrics the runner may report (timings and the candidate's own training terms:
#: not quality, never compared); anything else it sends is dropped
TRAIN_METRICS = frozenset({"candidate_jit", "candidate_compile_s", "train_s", "steps",
                           *(f"train_{c}{s}" for c in ("pde", "ic", "bc") for s in ("", "_max"))})


def _tampered(what: str) -> CandidateError:
    return CandidateError(FailureKind.TAMPERED, f"the training process returned {what}")


class PinnScorer:
    """Trusted half: validation points from the secret, validation and rel. L2 from params."""

    def __init__(self, config: dict[str, Any], secret: str | None = None) -> None:
        # a compilation cache this process fills while compiling the training functions
        # (the same ones a runner compiles): runners then load instead of compiling. The
        # worker restores it after every candidate (``shared_dirs``), so none can poison it.
        scratch = os.path.dirname(tempfile.gettempdir())
        self.cache_dir = os.path.join(scratch, f"atlas-jax-cache-{os.getpid()}")
        os.makedirs(self.cache_dir, exist_ok=True)
        config = {**config, "compilation_cache_dir": self.cache_dir}
        self.evaluator = PinnEvaluator(config)
        self.cfg = self.evaluator.cfg
        self.secret_key = None if secret is None else derive_seed(secret, "pinn-validation")
        sizes = [2] + [self.cfg.width] * self.cfg.depth + [1]
        self.shapes = [((i, o), (o,)) for i, o in zip(sizes[:-1], sizes[1:])]

    def public_config(self) -> dict[str, Any]:
        """Everything but the secret (the runner trains on public points)."""
        return self.cfg.to_dict()

    def shared_dirs(self) -> list[str]:
        """Directories runners read; the worker restores them after each candidate."""
        return [self.cache_dir]

    def _params(self, raw: Any) -> list:
        jnp = self.evaluator.jnp
        if not isinstance(raw, list) or len(raw) != len(self.shapes):
            raise _tampered(f"{len(raw) if isinstance(raw, list) else type(raw).__name__} "
                            f"layers instead of {len(self.shapes)}")
        params = []
        for layer, shapes in zip(raw, self.shapes):
            if not isinstance(layer, list) or len(layer) != 2:
                raise _tampered("a malformed layer")
            arrays = []
            for value, shape in zip(layer, shapes):
                try:
                    arr = np.asarray(value, dtype=np.float32)
                except (TypeError, ValueError) as exc:
                    raise _tampered(f"a non-numeric weight ({exc})") from exc
                if arr.shape != shape:
                    raise _tampered(f"a weight of shape {arr.shape}, expected {shape}")
                if not np.isfinite(arr).all():
                    raise CandidateError(FailureKind.NON_FINITE,
                                         "the trained network's weights are not finite")
                arrays.append(jnp.asarray(arr))
            params.append(tuple(arrays))
        return params

    def _stats(self, raw: Any) -> np.ndarray:
        try:
            stats = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise _tampered(f"malformed training statistics ({exc})") from exc
        if stats.ndim != 2 or stats.shape[0] != 3 or not np.isfinite(stats).all():
            raise _tampered(f"training statistics of shape {stats.shape} or not finite")
        return stats

    def score(self, code: str, context: dict[str, Any], link: Link) -> Evaluation:
        start = time.perf_counter()
        reply = link.recv()
        params, stats = self._params(reply.get("params")), self._stats(reply.get("stats"))
        metrics: dict[str, float] = {}
        for k, v in (reply.get("metrics") or {}).items():
            if k in TRAIN_METRICS and isinstance(v, (int, float)) and math.isfinite(v):
                metrics[k] = float(v)
        round_index, nu_value = int(context.get("round", 0)), _viscosity(context, self.cfg)
        eval_key = int(context.get("eval_key", zlib.crc32(code.encode("utf-8"))))
        val_metrics, vecs, extras = self.evaluator.validation(
            params, nu_value, stats, round_index, eval_key, self.secret_key)
        metrics.update(val_metrics, viscosity=nu_value)
        if self.cfg.score == "paper":  # the candidate's own loss, computed where it runs
            host = self.evaluator._host_extras(extras)
            link.send({"vecs": [np.asarray(v).tolist() for v in vecs],
                       "extras": {k: np.asarray(v).tolist() if np.ndim(v) else v
                                  for k, v in host.items()}})
            own = link.recv().get("own")
            if own is not None:
                if (isinstance(own, bool) or not isinstance(own, (int, float))
                        or not math.isfinite(own)):
                    raise CandidateError(FailureKind.NON_FINITE,
                                         f"the candidate's own validation loss is {own!r}")
                if own < 0:
                    raise CandidateError(FailureKind.TAMPERED,
                                         f"the candidate's own validation loss is {own} < 0: "
                                         f"outside the score's range (a loss is >= 0)")
                metrics["own_val_loss"] = float(own)
        link.send({"done": True})
        return self.evaluator.finish(metrics, start)


def make_scorer(config: dict[str, Any], secret: str | None = None) -> PinnScorer:
    """Factory of the trusted half (once per scorer worker; compiles validation too)."""
    return PinnScorer(config, secret)


def make_runner(config: dict[str, Any]) -> Any:
    """Factory of the untrusted half: JAX imported and training compiled before any code."""
    evaluator = PinnEvaluator(config, validation=False, cache_write=False)

    def run(code: str, context: dict[str, Any], link: Link) -> None:
        fn, params, stats, metrics = evaluator.train(code, context)
        link.send({"params": [[np.asarray(w).tolist(), np.asarray(b).tolist()]
                              for w, b in params],
                   "stats": np.asarray(stats).tolist(), "metrics": metrics})
        msg = link.recv()
        if "vecs" not in msg:
            return
        jnp = evaluator.jnp
        vecs = [jnp.asarray(np.asarray(v, np.float32)) for v in msg["vecs"]]
        extras = {k: jnp.asarray(np.asarray(v, np.float32)) if isinstance(v, list) else v
                  for k, v in msg["extras"].items()}
        try:
            own: float | None = float(np.asarray(fn(*vecs, extras)).reshape(()))
        except Exception:  # noqa: BLE001 - a metric; training already succeeded
            own = None
        link.send({"own": own if own is None or math.isfinite(own) else None})

    return run
