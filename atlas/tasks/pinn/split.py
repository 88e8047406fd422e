"""The PINN task split across the sandbox: the candidate's process only exports its loss.

``make_runner(public_config)`` (the candidate's single-use process): imports JAX and warms
up tracing and export (before any candidate code), then loads the program, traces its
``pinn_loss_strategy`` on abstract inputs of the trainer's exact shapes and sends the
StableHLO export (``loss_export``): ``value_and_grad`` at the training points and, with
``score=paper``, the loss at the validation points. It never trains: a process that runs
candidate Python could change its own training (walk frames to the loop, patch ``optax``).

``make_scorer(config, secret)`` (the trusted worker, which never runs candidate Python):
checks the module (a plain StableHLO function of the task's signature, no callbacks, bounded
tensors), compiles it, trains a fresh network with it, draws the validation points from the
run's secret, computes the validation losses and the relative L2 against Cole-Hopf, and
(score=paper) evaluates the exported loss on the validation residuals and range-checks it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from atlas.sandbox.link import Link
from atlas.sandbox.secret import derive_seed
from atlas.tasks.pinn import SEED_PROGRAM
from atlas.tasks.pinn.evaluator import PinnEvaluator
from atlas.types import Evaluation


class PinnScorer:
    """Trusted half: trains with the exported loss, validates on points from the secret."""

    def __init__(self, config: dict[str, Any], secret: str | None = None) -> None:
        self.evaluator = PinnEvaluator(config)
        self.cfg = self.evaluator.cfg
        self.secret_key = None if secret is None else derive_seed(secret, "pinn-validation")
        # the loaders' reference exports, before any candidate (worker start, not per candidate)
        self.evaluator.load_references()

    def public_config(self) -> dict[str, Any]:
        """Everything but the secret (the runner traces on the public shapes)."""
        return {**self.cfg.to_dict(), "compilation_cache_dir": None}

    def score(self, code: str, context: dict[str, Any], link: Link) -> Evaluation:
        sent = time.perf_counter()  # the worker has just handed the runner the program
        reply = link.recv()
        start = time.perf_counter()
        # the regime's hidden points: from the secret and the viscosity, never the code; the
        # export's time from this side's clock (a runner's number is never a metric)
        return self.evaluator.score_exported(reply.get("export"), context, self.secret_key,
                                             start=start, export_s=start - sent)


def make_scorer(config: dict[str, Any], secret: str | None = None) -> PinnScorer:
    """Factory of the trusted half (once per scorer worker; compiles training and validation)."""
    return PinnScorer(config, secret)


class PinnExporter:
    """Untrusted half: JAX imported and export warmed up before any candidate code."""

    def __init__(self, config: dict[str, Any]) -> None:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        self.evaluator = PinnEvaluator(config, validation=False, cache_write=False,
                                       compile=False)
        # warm-up: the first trace, lowering and serialization of a loss load JAX's MLIR
        # machinery (~0.3 s); done here, while the spare runner waits for a candidate
        self.evaluator.export(SEED_PROGRAM)

    def __call__(self, code: str, context: dict[str, Any], link: Link) -> None:
        link.send({"export": self.evaluator.export(code)})


def make_runner(config: dict[str, Any]) -> Any:
    """Factory of the untrusted half (once per runner, before the candidate arrives)."""
    return PinnExporter(config)
