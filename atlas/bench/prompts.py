"""``python -m atlas.bench prompts``: how often does the base model copy its prompt, per
prompt form?

Before any phase, a round-1 prompt shows the task's seed program as ``v0``. For each form of
``atlas.evolution.prompts.PROMPT_FORMS`` the untrained agent writes ``--samples``
completions per ``--seeds`` seed at ``--temperature``; each program is scored in the sandbox
(a fresh task secret, the run's scorer) and labelled by ``atlas.novelty`` against the seed.
Printed per task and form: the copy rate, the valid rate, the share of new programs, and new
valid programs per proposal, with their counts. The same seeds draw the same random numbers
under every form, so forms differ by their text only. ``--out`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench prompts", description=__doc__)
    p.add_argument("--tasks", nargs="+", default=["bandit", "pinn"])
    p.add_argument("--forms", nargs="+", default=None, help="default: every form")
    p.add_argument("--samples", type=int, default=8, help="completions per prompt and seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny (tests)")
    p.add_argument("--out", default=None)
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])
    from omegaconf import OmegaConf

    # deferred: torch, transformers and the sandbox load after the arguments are checked
    from atlas.agent.adapters import POLICY
    from atlas.agent.research_agent import ResearchAgent
    from atlas.bench.machine import bench_model_cfg
    from atlas.evolution.database import ProgramDatabase
    from atlas.evolution.explorer import Explorer
    from atlas.evolution.prompts import PROMPT_FORMS, build_prompt
    from atlas.novelty import tally
    from atlas.sandbox import Resources, Sandbox
    from atlas.schema import ExploreConfig, ModelConfig
    from atlas.tasks import make_task

    forms = args.forms or list(PROMPT_FORMS)
    unknown = [f for f in forms if f not in PROMPT_FORMS]
    if unknown:
        raise SystemExit(f"--forms {unknown}: use forms of {sorted(PROMPT_FORMS)}")
    ex = ExploreConfig.from_cfg(OmegaConf.load(ROOT / "conf" / "explore" / "default.yaml"))
    agent = ResearchAgent(ModelConfig.from_cfg(bench_model_cfg(args.model)), device="cpu",
                          seed=0)
    rows = []
    for name in args.tasks:
        task = make_task(name)
        entry = task.prompt_spec().entry_point
        sandbox = Sandbox.for_task(task, secret=secrets.token_hex(32),
                                   resources=Resources(workers=2))
        try:
            db = ProgramDatabase(ex, 0, entry_point=entry)
            explorer = Explorer(task, agent, sandbox, db, ex, 0)
            parents = [explorer.seed_islands()[0]]
            context = task.context(1)
            for form in forms:
                text = agent.chat_prompt(*build_prompt(task.prompt_spec(), parents, None, form))
                records, t0 = [], time.perf_counter()
                for seed in args.seeds:
                    for a in explorer.write_unfiled([text], args.samples,
                                                    temperature=args.temperature, seed=seed,
                                                    context=context, adapter=POLICY)[0]:
                        score = a.evaluation.score if a.evaluation.passed else None
                        records.append({"novelty": db.novelty.label(a.code, score, parents[0].regime,
                                                                    parents,
                                                                    a.evaluation.behaviour),
                                        "evaluation": {"passed": a.evaluation.passed}})
                row = {"task": name, "form": form, **tally(records),
                       "seconds": time.perf_counter() - t0}
                rows.append(row)
                print(f"{name:8s} {form:12s} copies {row['copies']}/{row['proposals']} "
                      f"valid {row['valid']}/{row['evaluated']} new {row['labels']['new']} "
                      f"new&valid {row['new_valid']}/{row['proposals']} "
                      f"({row['seconds']:.0f} s)", flush=True)
        finally:
            sandbox.close()
    out = {"samples": args.samples, "seeds": args.seeds, "temperature": args.temperature,
           "model": args.model, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
