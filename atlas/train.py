"""Hydra entry point: ``python -m atlas.train method=atlas task=pinn -m seed=0,1,2``.

Thin by design: compose and validate the config, build the logger, run the loop, print
a summary. The algorithm lives in ``atlas.loop``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from atlas.config import validate
from atlas.interrupt import Terminated, stop_on_sigterm
from atlas.loggers import finish_logger, make_logger
from atlas.runfolder import prepare

log = logging.getLogger("atlas.train")

# "_<overrides>" when a sweep job has overrides beyond task/method/seed, else "" (run folder names)
if not OmegaConf.has_resolver("atlas.suffix"):
    OmegaConf.register_new_resolver("atlas.suffix", lambda s: f"_{s}" if s else "")


def summary(results: dict[str, Any]) -> str:
    def fmt(x: Any) -> str:
        return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = [
        f"ATLAS run: task={results['task']} method={results['method']} seed={results['seed']}",
        f"  best score  initial {fmt(results['initial_score'])} -> final {fmt(results['final_score'])}"
        f"  (improvement {fmt(results['improvement_pct'])}%)",
        f"  agent's own best {fmt(results.get('final_agent'))}"
        f"  (improvement {fmt(results.get('improvement_agent_pct'))}%)",
        f"  valid programs  first round {fmt(results['valid_rate_first_round'])}, last round "
        f"{fmt(results['valid_rate_last_round'])}, all {fmt(results['valid_rate'])}",
        f"  phases {results['phases']} (trained {results['phases_trained']}), promotions "
        f"{results['promotions']}, accept rate {fmt(results['accept_rate'])}",
        f"  candidates {results['candidates']} of budget {fmt(results.get('candidate_budget'))} "
        f"{results.get('candidates_by_source') or ''}, wall {results['wall_seconds']:.0f} s",
    ]
    if results.get("isolation"):
        reason = results.get("isolation_reason")
        lines.append(f"  sandbox isolation {results['isolation']}"
                     + (f" (degraded: {reason})" if reason else ""))
    return "\n".join(lines)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume) one job whose outputs go to ``cfg.run_dir``; a folder holding a run of
    another configuration is refused (``atlas.runfolder``)."""
    from atlas.loop import EvolutionLoop

    validate(cfg)
    run_dir = Path(cfg.run_dir)
    prepare(cfg, run_dir)  # writable, and not another configuration's run
    logger = make_logger(cfg, run_dir)
    status = "failed"
    with stop_on_sigterm():
        try:
            loop = EvolutionLoop(cfg, run_dir, logger)
            try:
                results = loop.run()
                status = "success"
            finally:
                loop.close()
        except Terminated:
            log.warning("SIGTERM: stopped; %s keeps the checkpoint of the last finished round, "
                        "re-run the same command to resume", run_dir)
            raise
        finally:
            finish_logger(logger, status)
    print(summary(results), flush=True)
    print(f"  outputs in {run_dir}", flush=True)
    return results


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)["final_score"]


def hoist_multirun_flag(argv: list[str]) -> list[str]:
    """Let ``-m`` stand anywhere (``... task=pinn -m seed=0,1``): Hydra's parser needs it before
    the overrides on Python < 3.12, where argparse cannot split positionals around a flag."""
    flags = [a for a in argv[1:] if a in ("-m", "--multirun")]
    rest = [a for a in argv[1:] if a not in ("-m", "--multirun")]
    return [argv[0], *flags[:1], *rest]


if __name__ == "__main__":
    from atlas.compose import searchpath_problem

    if problem := searchpath_problem(sys.argv[1:]):  # Hydra would say only "Could not find"
        sys.exit(problem)
    sys.argv = hoist_multirun_flag(sys.argv)
    main()
