"""A saved W&B workspace for ATLAS's agent dynamics, in one command.

    python -m atlas.dashboard --project atlas [--entity E] [--group SWEEP] [--print]

builds a workspace (``wandb-workspaces``) whose panels put a project's runs, or one sweep's
group, side by side: the islands' scores, the valid rate and failure kinds, the agent-only
best beside the any-source best, DPO per phase, the gate's gain, bound and KL with its
outcomes, the strategist's knobs and the supporters' actions, and the sampler. Every panel
reads a key ``atlas.telemetry`` logs (``round/*`` against the round, ``phase/*`` against the
phase); ``docs/dashboard.md`` says what each shows and how runs get to the W&B server (runs
log offline by default: ``wandb sync`` first). ``--print`` writes the workspace's spec as
JSON and saves nothing (no server needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

ROUND, PHASE, STEP = "round/round", "phase/phase", "Step"


@dataclass(frozen=True)
class Chart:
    """One panel: the keys it plots (``y``, or every key matching ``regex``) against ``x``.

    ``kind``: ``line``; ``stacked`` (a stacked area: counts that add up); ``table`` (a W&B
    table logged at the end of the run, named by ``y[0]``). ``pending`` names a field a run does
    not log yet (the panel stays empty until runs log it)."""

    title: str
    x: str
    y: tuple[str, ...] = ()
    regex: str | None = None
    kind: str = "line"
    log_y: bool = False
    pending: str = ""


#: the workspace's sections, top to bottom (docs/dashboard.md describes each panel)
SECTIONS: tuple[tuple[str, tuple[Chart, ...]], ...] = (
    ("Islands and validity", (
        Chart("Best score per island", ROUND, regex=r"^round/islands/\d+/best$"),
        Chart("Median score per island", ROUND, regex=r"^round/islands/\d+/median$"),
        Chart("Valid rate of the agent's programs", ROUND, ("round/valid_rate",)),
        Chart("Failure kinds per round", ROUND, regex=r"^round/failures/.+$", kind="stacked"),
    )),
    ("Agent-only best beside any-source best", (
        Chart("Best so far: any source and agent only", ROUND,
              ("round/best", "round/best_agent")),
        Chart("Candidates per round: agent and supporter", ROUND,
              ("round/candidates", "round/supporter_candidates"), kind="stacked"),
    )),
    ("Novelty: new programs or copies", (
        Chart("Agent: proposals, copies (not evaluated) and new valid programs per round",
              ROUND, ("round/novelty/agent/proposals", "round/novelty/agent/copies",
                      "round/novelty/agent/new_valid")),
        Chart("Agent: copy rate and new valid programs per proposal", ROUND,
              ("round/novelty/agent/copy_rate", "round/novelty/agent/new_valid_per_proposal")),
        Chart("Supporters: proposals, copies and new valid programs per round", ROUND,
              ("round/novelty/supporter/proposals", "round/novelty/supporter/copies",
               "round/novelty/supporter/new_valid")),
        Chart("Labels of the agent's evaluated programs per round", ROUND,
              regex=r"^round/novelty/agent/labels/.*$", kind="stacked"),
        Chart("New programs above their parents per round", ROUND,
              ("round/novelty/agent/new_beats_parents",
               "round/novelty/supporter/new_beats_parents")),
    )),
    ("Learning probe per phase", (
        Chart("Probe: valid rate before and after the phase", PHASE,
              ("phase/probe/before/valid_rate", "phase/probe/after/valid_rate")),
        Chart("Probe: valid slots fail->pass and pass->fail; mean score change", PHASE,
              ("phase/probe/change/valid_rate/fail_to_pass",
               "phase/probe/change/valid_rate/pass_to_fail",
               "phase/probe/change/score/mean")),
        Chart("Probe: copies and new valid programs, before and after", PHASE,
              ("phase/probe/before/novelty/copies", "phase/probe/after/novelty/copies",
               "phase/probe/before/novelty/new_valid", "phase/probe/after/novelty/new_valid")),
        Chart("Probe: KL per token to the base and to the reference", PHASE,
              ("phase/probe/kl_base", "phase/probe/kl_reference"), log_y=True),
        Chart("Probe: held-out pairs, preference accuracy and margin", PHASE,
              regex=r"^phase/probe/heldout/(pairs|accuracy|margin)$"),
    )),
    ("DPO per phase", (
        Chart("DPO loss (phase mean, first and last step)", PHASE,
              ("phase/dpo/loss", "phase/dpo/loss_first", "phase/dpo/loss_last")),
        Chart("DPO reward margin", PHASE,
              ("phase/dpo/margin", "phase/dpo/chosen_reward", "phase/dpo/rejected_reward")),
        Chart("DPO preference accuracy", PHASE,
              ("phase/dpo/accuracy", "phase/dpo/accuracy_first", "phase/dpo/accuracy_last")),
        Chart("DPO loss per step", STEP, ("dpo_step/loss", "dpo_step/margin")),
    )),
    ("Gate and reference", (
        Chart("Gate: gain, its lower bound and epsilon", PHASE,
              ("phase/gate/gain", "phase/gate/lower_bound", "phase/gate/epsilon")),
        Chart("Gate: KL to the reference and delta", PHASE, ("phase/gate/kl", "phase/gate/delta")),
        Chart("Phase outcome: promoted, vetoed, insufficient evidence, skipped", PHASE,
              ("phase/promoted", "phase/vetoed", "phase/gate/insufficient_evidence",
               "phase/skipped")),
        Chart("Gate evidence: informative completions", PHASE,
              ("phase/gate/evidence/informative_completions", "phase/gate/evidence/minimum")),
        Chart("Phases (every decision and its reason)", PHASE, ("phases",), kind="table"),
    )),
    ("Strategist and supporters", (
        Chart("Strategist: knob values", PHASE, regex=r"^phase/strategist/values/.+$", log_y=True),
        Chart("Strategist: knobs changed (1 = changed)", PHASE, regex=r"^phase/interventions/.+$",
              kind="stacked"),
        Chart("Exploration supporter: actions per round", ROUND,
              ("round/supporters/critiques", "round/supporters/temperature_changes",
               "round/supporters/patches", "round/supporters/patches_as_preferences",
               "round/supporters/patches_dropped_for_budget", "round/supporters/fallbacks")),
    )),
    ("Sampler", (
        Chart("Sampler: generated tokens per second", ROUND, ("round/sampler/tok_s",)),
        Chart("Seconds per round: generating and waiting for scores", ROUND,
              ("round/seconds/generate", "round/seconds/evaluate_wait", "round/seconds/total")),
    )),
)


def charts() -> list[Chart]:
    return [c for _, section in SECTIONS for c in section]


def _intro(project: str, group: str | None) -> str:
    scope = f"the runs of sweep group `{group}`" if group else f"every run of project `{project}`"
    return (f"**ATLAS agent dynamics** for {scope}, grouped by method (job type). "
            "Round charts run against `round/round`, phase charts against `phase/phase`. "
            "What each panel shows: `docs/dashboard.md`. Rebuilt by "
            f"`python -m atlas.dashboard --project {project}"
            + (f" --group {group}" if group else "") + "`.")


def _panel(chart: Chart) -> Any:
    import wandb_workspaces.reports.v2 as wr

    if chart.kind == "table":  # the library's one panel for a logged table
        return wr.WeavePanelSummaryTable(table_name=chart.y[0], layout=wr.Layout(w=24, h=10))
    return wr.LinePlot(title=chart.title, x=chart.x, y=list(chart.y),
                       metric_regex=chart.regex, log_y=chart.log_y or None,
                       plot_type="stacked-area" if chart.kind == "stacked" else None,
                       title_x=chart.x)


def build_workspace(project: str, entity: str, group: str | None = None,
                    name: str | None = None, per_run: bool = False) -> Any:
    """The workspace object (``wandb_workspaces.workspaces.Workspace``), not saved.

    ``group``: only this sweep's runs (a multirun's W&B group is its sweep folder's name).
    ``per_run``: one line per run instead of one per method (mean with its min-max band)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    sections = [ws.Section(name=title, panels=[_panel(c) for c in section], is_open=True)
                for title, section in SECTIONS]
    sections[0].panels.insert(0, wr.MarkdownPanel(markdown=_intro(project, group)))
    runset = ws.RunsetSettings(
        filters=[expr.Metric("Group") == group] if group else "",
        groupby=[] if per_run else [expr.Metric("JobType")])
    return ws.Workspace(
        entity=entity, project=project,
        name=name or (f"ATLAS agent dynamics: {group}" if group else "ATLAS agent dynamics"),
        sections=sections, runset_settings=runset,
        settings=ws.WorkspaceSettings(x_axis=ROUND, max_runs=100))


def panel_keys(workspace: Any) -> list[tuple[str, list[str], str | None]]:
    """Each panel's (title, keys it names, key pattern) as the built workspace holds them, in
    the names W&B stores (``Step`` is ``_step``): a line plot's x and y keys and its metric
    regex, a table panel's table name."""
    from wandb_workspaces.expr import to_backend_name

    out = []
    for section in workspace.sections:
        for panel in section.panels:
            if hasattr(panel, "table_name"):
                out.append((panel.table_name, [panel.table_name], None))
            elif hasattr(panel, "metric_regex"):
                keys = [to_backend_name(k) for k in (panel.x, *panel.y) if isinstance(k, str)]
                out.append((panel.title or "", keys, panel.metric_regex))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atlas.dashboard", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", default="atlas", help="W&B project of the runs (logger.project)")
    ap.add_argument("--entity", help="W&B entity (default: your default entity)")
    ap.add_argument("--group", help="only this sweep's runs: the sweep folder's name")
    ap.add_argument("--name", help="the workspace's name")
    ap.add_argument("--per-run", action="store_true",
                    help="one line per run instead of one per method")
    ap.add_argument("--print", action="store_true", dest="dry",
                    help="print the workspace spec as JSON; save nothing")
    args = ap.parse_args(argv)
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        print("atlas.dashboard needs wandb-workspaces: pip install 'wandb-workspaces>=0.4.13' "
              "(scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    if args.dry:
        workspace = build_workspace(args.project, args.entity or "entity", args.group,
                                    args.name, args.per_run)
        spec = workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")
        print(json.dumps(spec, indent=1))
        return 0
    where = f"{args.entity or '<your default entity>'}/{args.project}"
    try:  # no login, no server, no such project or entity: one line
        import wandb

        entity = args.entity or wandb.Api().default_entity
        if not entity:
            raise ValueError("no default W&B entity; pass --entity")
        workspace = build_workspace(args.project, entity, args.group, args.name, args.per_run)
        workspace.save()
    except Exception as exc:  # noqa: BLE001
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"atlas.dashboard: saving a workspace to {where} failed ({first}); `wandb login`, "
              "and `wandb sync` the runs first (docs/dashboard.md)", file=sys.stderr)
        return 1
    print(f"saved: {workspace.url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
