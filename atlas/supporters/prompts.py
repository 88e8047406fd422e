"""Render the role prompts from the templates in ``atlas/supporters/prompts/*.txt``.

Templates use ``string.Template`` (``$name``) rather than ``str.format`` because they
contain literal JSON braces. A template file holds a ``[system]`` and a ``[user]`` section.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from string import Template

from atlas.supporters.config import ExplorationConfig
from atlas.supporters.schemas import (
    ExplorationRequest,
    InspectorRequest,
    StrategistRequest,
)


@cache
def _text(name: str) -> str | None:
    path = resources.files("atlas.supporters") / "prompts" / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def template(role: str) -> tuple[Template, Template]:
    """(system, user) templates of a role."""
    text = _text(f"{role}.txt")
    if text is None or "[user]" not in text:
        raise FileNotFoundError(f"prompt template atlas/supporters/prompts/{role}.txt is missing "
                                "or has no [user] section")
    system, user = text.split("[user]", 1)
    return Template(system.replace("[system]", "", 1).strip()), Template(user.strip())


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or v != v else f"{v:.4g}"  # None or NaN: not measured


def _dec(v: float) -> str:
    """A plain decimal (0.00005, not 5e-05): small models misread exponents (SmolLM2 turned
    lr=5e-05 into 0.005 in 5 of 5 answers)."""
    return f"{v:.10f}".rstrip("0").rstrip(".") if v != 0 else "0"


def exploration(req: ExplorationRequest, cfg: ExplorationConfig) -> tuple[str, str]:
    system, user = template("exploration")
    ranked = sorted(req.programs, key=lambda p: (p.passed, p.score or 0.0), reverse=True)
    blocks = []
    for i, p in enumerate(ranked[: cfg.programs_in_prompt]):
        head = (f"# program {i + 1}: score {_fmt(p.score)}" if p.passed
                else f"# program {i + 1}: FAILED ({p.failure_kind}) {p.message[:160]}")
        blocks.append(f"{head}\n{p.code[: cfg.code_chars]}")
    focus = (_text(f"focus_{req.task_name}.txt") or "the task's main hyper-parameters").strip()
    values = dict(task_name=req.task_name, island=req.island, round=req.round,
                  problem=req.problem, signature=req.signature or req.entry_point,
                  hints="; ".join(req.hints) or "none", focus=focus,
                  programs="\n\n".join(blocks) or "(none yet)", temperature=req.temperature,
                  t_lo=req.temperature_bounds[0], t_hi=req.temperature_bounds[1],
                  entry_point=req.entry_point, max_patches=cfg.max_patches)
    return system.substitute(values), user.substitute(values)


def strategist(req: StrategistRequest) -> tuple[str, str]:
    system, user = template("strategist")
    gates = [f"{'accepted' if g.accepted else 'rejected'} (gain {_fmt(g.gain)}, KL {_fmt(g.kl)})"
             for g in req.gate_decisions[:5]]
    k, b, s, d = req.knobs, req.bounds, req.scores, req.dpo
    pairs = "n/a (no fine-tuning yet)" if req.pairs_built is None else req.pairs_built
    values = dict(phase=req.phase, pairs_built=pairs, best=_fmt(s.best),
                  median=_fmt(s.median), min=_fmt(s.min), valid_rate=f"{s.valid_rate:.2f}",
                  diversity=f"{req.diversity:.2f}", gates="; ".join(gates) or "none",
                  loss=_fmt(d.loss), accuracy=_fmt(d.accuracy), margin=_fmt(d.margin),
                  beta=k.beta, lr=_dec(k.lr), epochs=k.epochs,
                  score_threshold="null" if k.score_threshold is None else k.score_threshold,
                  beta_lo=b.beta[0], beta_hi=b.beta[1], lr_lo=_dec(b.lr[0]), lr_hi=_dec(b.lr[1]),
                  ep_lo=b.epochs[0], ep_hi=b.epochs[1])
    return system.substitute(values), user.substitute(values)


def inspector(req: InspectorRequest) -> tuple[str, str]:
    system, user = template("inspector")
    names = [m.name for m in req.quality_metrics]
    directions = "; ".join(
        f"{m.name}: {'higher' if m.direction == 'max' else 'lower'} is better"
        + (f" ({m.description})" if m.description else "")
        for m in req.quality_metrics) or "the task declares none: nothing to compare"
    g = req.gate
    values = dict(phase=req.phase, gain=_fmt(g.gain), epsilon=_fmt(g.epsilon), kl=_fmt(g.kl),
                  delta=_fmt(g.delta), directions=directions,
                  candidate=json.dumps({n: req.candidate_metrics.get(n) for n in names}),
                  reference=json.dumps({n: req.reference_metrics.get(n) for n in names}))
    return system.substitute(values), user.substitute(values)
