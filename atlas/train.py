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
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from atlas.agent.device import resolve_device
from atlas.atomic import disk_full_error, write_text_atomic
from atlas.commandline import FAILED, MISTAKE, problem
from atlas.config import Settings, command_line, validate
from atlas.interrupt import Stopped, settle, stop_on_signals
from atlas.loggers import finish_logger, make_logger
from atlas.overrides import split
from atlas.quiet import install
from atlas.runfolder import (
    LogFilesHeld,
    check_writable,
    finished_results,
    holds_run,
    locked,
    log_files_held,
    new_folder_hint,
    prepare,
)

log = logging.getLogger("atlas.train")


class DiskFull(RuntimeError, CompactHydraException):
    """The disk filled up while the run wrote to it; one line naming the file and the fix."""


# "_<overrides>" when a sweep job has overrides beyond task/method/seed, else "" (run folder names)
if not OmegaConf.has_resolver("atlas.suffix"):
    OmegaConf.register_new_resolver("atlas.suffix", lambda s: f"_{s}" if s else "")


def probe_text(probe: dict[str, Any]) -> str:
    """The learning probe's line of a phase (``atlas.results.probe_line``), in words a
    newcomer reads without the docs: the valid programs before and after as counts with the
    exact sign test of the slots that changed (a t interval on 6-8 binary slots misleads),
    the copies and new valid programs, the mean score change with its 95 % CI and a verdict,
    how far the policy moved (KL in nats per token), the held-out accuracy (only from
    ``MIN_ACCURACY_PAIRS`` pairs on, with its binomial p), and its cost. All of the line's
    wording lives here."""
    from atlas.stats import MIN_ACCURACY_PAIRS  # deferred: numpy, after the config is checked

    def num(v: Any, form: str) -> str:
        return "n/a" if v is None else format(v, form)

    n = (probe.get("prompts") or 0) * (probe.get("samples") or 0)
    vc = probe.get("valid_change") or {}
    sc = probe.get("score_change") or {}

    def count(rate: Any) -> str:
        return "n/a" if rate is None else f"{round(rate * n)}/{n}"

    parts = [f"learning probe, {n} programs on prompts this phase did not train on: valid "
             f"{count(probe.get('valid_before'))} before -> {count(probe.get('valid_after'))} "
             "after"]
    if "fail_to_pass" in vc:
        parts[-1] += (f" ({vc['fail_to_pass']} fail->pass, {vc['pass_to_fail']} pass->fail, "
                      f"sign test p {num(vc.get('p'), '.2f')})")
    if probe.get("copies_before") is not None:
        parts.append(f"copies of earlier programs {probe['copies_before']} -> "
                     f"{probe['copies_after']}, new & valid {probe['new_valid_before']} -> "
                     f"{probe['new_valid_after']}")
    mean, lo, hi = sc.get("mean"), sc.get("t_lo"), sc.get("t_hi")
    if mean is None:
        parts.append("mean score change n/a")
    elif lo is None or hi is None:
        parts.append(f"mean score change {num(mean, '+.3g')} (too few programs for a 95 % CI)")
    else:
        verdict = "no evidence of change" if lo <= 0 <= hi else "rose" if lo > 0 else "fell"
        parts.append(f"mean score change {num(mean, '+.3g')} (95 % CI {num(lo, '+.3g')} to "
                     f"{num(hi, '+.3g')}: {verdict})")
    parts.append(f"the policy moved {num(probe.get('kl_base'), '.2e')} nats/token from the "
                 f"base model, {num(probe.get('kl_reference'), '.2e')} from the reference")
    pairs = probe.get("heldout_pairs") or 0
    if pairs < MIN_ACCURACY_PAIRS:
        parts.append(f"held-out preference accuracy: too few pairs ({pairs})")
    else:
        parts.append(f"it preferred the better program in "
                     f"{num(probe.get('heldout_accuracy'), '.2f')} of {pairs} held-out pairs "
                     f"(0.5 = chance, binomial p {num(probe.get('heldout_p'), '.2f')})")
    share = probe.get("share_of_phase")
    parts.append(f"{num(probe.get('seconds'), '.0f')} s"
                 + (f" ({share:.0%} of the phase)" if share is not None else ""))
    return "; ".join(parts)


def phase_text(p: dict[str, Any]) -> str:
    """The summary's lines of a phase: what the reference did (``atlas.results.phase_line``)
    and, below it, what the learning probe found."""
    text = _reference_text(p)
    if p.get("probe"):
        text += "\n    " + probe_text(p["probe"])
    return text


#: a skipped phase's recorded reason, said so that a newcomer reads what happened and why
SKIP_WORDS = {
    "no preference pairs could be built": (
        "nothing to learn from: a DPO pair needs, for one prompt, a program that ran and one "
        "that failed or scored lower, and this phase had none (every program failing, as the "
        "tiny test model's do, leaves none)"),
    "no score improvement this phase (paper B.4)": (
        "the best score did not improve this phase, and this method fine-tunes only after an "
        "improvement"),
}


def _reference_text(p: dict[str, Any]) -> str:
    head = f"phase {p['phase']} (round {p.get('round')}): "
    if not p["trained"]:
        why = SKIP_WORDS.get(str(p.get("why")))
        return head + f"skipped ({p.get('why')})" + (f": {why}" if why else "")
    if p["outcome"] == "fixed reference":
        return head + "trained; reference fixed (the base model)"

    def num(key: str, form: str) -> str:
        v = p.get(key)
        return "n/a" if v is None else format(v, form)

    gk = (f"G_k {p.get('evidence')}{' (in-sample)' if p.get('in_sample') else ''} "
          f"{p.get('informative_completions')}/{p.get('completions')} informative")
    nums = (f"gain {num('gain', '+.4f')}, lower {num('lower_bound', '+.4f')}, "
            f"KL {num('kl', '.2e')}")
    if p["outcome"] == "promoted":
        end = f"promoted {p.get('candidate')} ({p.get('why')})"
    elif p["outcome"] == "rejected":
        end = str(p.get("why"))
    else:
        end = f"{p['outcome']}: {p.get('why')}"
    return head + f"trained; {gk}; {nums} -> {end}"


def _when(phase: int) -> str:
    """Exploration phase k in words: the rounds before the first training, or after the
    (k-1)-th."""
    return "before phase 1" if phase <= 1 else f"after phase {phase - 1}"


def valid_line(results: dict[str, Any], writer: str) -> str:
    """The writer's valid rate per exploration phase (a record without it: first and last
    round, as it was written)."""
    def fmt(x: Any) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    by_phase = results.get("valid_rate_by_phase")
    if by_phase is None:
        return (f"  valid programs  first round {fmt(results.get('valid_rate_first_round'))}, "
                f"last round {fmt(results.get('valid_rate_last_round'))}, all "
                f"{fmt(results.get('valid_rate'))}")
    phases = ", ".join(f"{_when(int(k))} {fmt(v)}" for k, v in by_phase.items())
    return f"  {writer}'s valid programs  {phases}; all {fmt(results.get('valid_rate'))}"


def novelty_lines(results: dict[str, Any], writer: str) -> list[str]:
    """One line per writer: per exploration phase, the proposals, how many repeated a
    program the run had (copies), and the new valid programs (and those above their
    parents), before the first phase and after each."""
    nov = results.get("novelty")
    if not nov or not nov.get("by_phase"):
        return []
    out = []
    for who, label in (("agent", writer), ("supporter", "supporters")):
        parts = []
        for row in nov["by_phase"]:
            t = row.get(who) or {}
            if not t.get("proposals"):
                continue
            parts.append(f"{_when(int(row['phase']))} {t['copies']}/{t['proposals']} copies, "
                         f"{t['new_valid']} new & valid ({t['new_beats_parents']} above parents)")
        if parts:
            out.append(f"  novelty ({label}): " + "; ".join(parts))
    return out


def summary(results: dict[str, Any]) -> str:
    def fmt(x: Any) -> str:
        return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)

    # a run without an LLM (``model`` None): its writer is the literal search, whose programs
    # the records file under the agent's source, and no agent is named where none ran
    writer = "agent" if results.get("model", "llm") is not None else "literal search"
    by_source = results.get("candidates_by_source") or ""
    if by_source and writer != "agent":
        by_source = {(writer if k == "agent" else k): v for k, v in by_source.items()}
    lines = [
        f"ATLAS run: task={results['task']} method={results['method']} seed={results['seed']}",
        f"  best score  initial {fmt(results['initial_score'])} -> final {fmt(results['final_score'])}"
        f"  (improvement {fmt(results['improvement_pct'])}%)",
        f"  {writer}'s own best {fmt(results.get('final_agent'))}"
        f"  (improvement {fmt(results.get('improvement_agent_pct'))}%)",
        valid_line(results, writer),
        *novelty_lines(results, writer),
        f"  phases {results['phases']} (trained {results['phases_trained']}), promotions "
        f"{results['promotions']}, accept rate {fmt(results['accept_rate'])}"
        + (f", insufficient evidence {results['insufficient_evidence']}"
           if results.get("insufficient_evidence") else ""),
        f"  candidates {results['candidates']} of budget {fmt(results.get('candidate_budget'))} "
        f"{by_source}, wall {results['wall_seconds']:.0f} s",
    ]
    lines += ["  " + phase_text(p) for p in results.get("reference_log") or []]
    if results.get("supporter_calls"):
        lines.append("  supporters " + "; ".join(
            f"{role} {c['answered']} answered, {c['invalid']} invalid, {c['fell_back']} fell back"
            for role, c in results["supporter_calls"].items()))
    if results.get("isolation"):
        reason = results.get("isolation_reason")
        lines.append(f"  sandbox isolation {results['isolation']}"
                     + (f" (degraded: {reason})" if reason else ""))
    return "\n".join(lines)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume) one job whose outputs go to ``cfg.run_dir``.

    Order matters for what a mistake costs: the config is validated first, without torch (a
    typo fails in a second or two), then the run folder is checked and locked (one process
    per run folder, ``atlas.runfolder``), then the device, and only then is anything built.
    Errors the user can fix end in one line naming the field or file and the fix (Hydra
    prints a ``CompactHydraException``'s message without a traceback); SIGTERM, Ctrl-C and a
    full disk stop the run with the checkpoint of its last finished round.
    """
    _, sweep = command_line()

    install()  # library warnings a user cannot act on (atlas/quiet.py lists them)
    run_dir = Path(cfg.run_dir)  # read before validation: its errors are written there too
    # the run folder's train.log only once this process holds the folder
    with stop_on_signals(), log_files_held() as logs:
        try:
            return _run(cfg, run_dir, logs)
        except Stopped as stop:
            log.warning("%s: stopped; %s", stop.signal_name, _resume_hint(run_dir))
            raise
        except Exception as exc:
            err = _one_line(exc, run_dir, sweep)
            if err is exc:
                raise
            raise err from None


def _run(cfg: DictConfig, run_dir: Path, logs: LogFilesHeld) -> dict[str, Any]:
    settings = validate(cfg)
    check_writable(run_dir)
    with locked(run_dir):
        logs.release()
        prepare(cfg, run_dir, resume=settings.run.resume)  # not another configuration's run
        done = finished_results(run_dir) if settings.run.resume else None
        if done is not None:  # said before a model, a sandbox or a logger is built
            log.info("%s already holds a finished run; set %s for a new one", run_dir,
                     new_folder_hint())
        results = done if done is not None else _evolve(cfg, settings, run_dir)
        text = summary(results) + f"\n  outputs in {run_dir}\n"
        write_summary(run_dir, text)
    print(text, end="", flush=True)
    return results


#: the summary as printed, kept in the run folder (read it later without re-running)
SUMMARY = "summary.txt"


def write_summary(run_dir: Path, text: str) -> None:
    """Keep the printed summary in ``run_dir/summary.txt`` so it outlives the terminal; a
    write that fails (a full disk) is said in one log line, since the run's own files are
    already safe."""
    path = run_dir / SUMMARY
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return  # a finished run's re-run: nothing new to write
        write_text_atomic(path, text)
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


def _evolve(cfg: DictConfig, settings: Settings, run_dir: Path) -> dict[str, Any]:
    """Build the run's parts and run (or resume) it; the run folder is locked."""
    resolve_device(settings.run.device)  # device=cuda without a GPU stops here
    if settings.supporters:  # a dead supporter server is a finding, before anything loads
        # deferred: loads openai; only a run with supporters needs it
        from atlas.supporters.health import check_supporters

        check_supporters(settings.supporters)
    # deferred: loads torch, transformers, peft and lightning, only once the config, the
    # run folder and the device are checked (a typo fails in a second or two)
    from atlas.loop import EvolutionLoop

    record = OmegaConf.to_container(cfg, resolve=True)  # the config event, W&B's config
    logger = make_logger(settings.logger, run_dir, record)
    status = "failed"
    try:
        loop = EvolutionLoop(settings, record, run_dir, logger)
        try:
            if callable(getattr(logger, "log_hyperparams", None)):  # the W&B config too
                logger.log_hyperparams(
                    {"provenance": loop.provenance()})
            results = loop.run()
            status = "success"
        finally:
            loop.close()
    finally:
        finish_logger(logger, status)
    return results


def _resume_hint(run_dir: Path) -> str:
    if holds_run(run_dir):
        return (f"{run_dir} keeps the checkpoint of the last finished round; re-run the same "
                f"command to resume")
    return f"{run_dir} holds no checkpoint yet; re-running the same command starts the run afresh"


def _one_line(exc: Exception, run_dir: Path, sweep: bool) -> Exception:
    """What ``run`` raises for ``exc``: a full disk becomes ``DiskFull``; a message of one line
    goes to the job's ``train.log`` and, in a sweep, to the console at once (Hydra's launcher
    reports a failed job only when its whole batch has ended); anything else, a bug, keeps
    its traceback."""
    full = disk_full_error(exc)
    if full is not None and not isinstance(exc, DiskFull):
        where = full.filename or run_dir
        exc = DiskFull(f"the disk is full ({full.strerror or 'No space left on device'}) "
                       f"writing {where}: free space on it; {_resume_hint(run_dir)}")
    if not isinstance(exc, CompactHydraException):
        return exc
    if sweep:
        log.error("this job stopped: %s", exc)
    else:  # the console line is Hydra's; the run folder's log keeps it too
        _to_log_files(f"stopped: {exc}")
    return exc


def _to_log_files(message: str) -> None:
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            try:
                handler.handle(record)
            except Exception:  # noqa: BLE001 - a full disk: the console line is enough
                pass


def run_command(cfg: DictConfig) -> float | None:
    """``run`` as the command line's job: an error the user can fix is printed as its one
    line and exits with its kind's status (``atlas.commandline``: 2 refused at start, 1 failed
    while running); Hydra would frame it with three more lines. In a sweep it goes to Hydra,
    whose launcher then runs the other jobs; ``run`` has logged it already."""
    logging.raiseExceptions = False  # a log line that cannot be written (a full disk) is
    try:                             # dropped, not printed as a traceback
        return run(cfg)["final_score"]
    except Stopped:
        settle()  # a Ctrl-C while the process exits: no traceback, the same status
        raise
    except CompactHydraException as exc:
        if command_line()[1]:
            raise
        print(exc, file=sys.stderr, flush=True)
        raise SystemExit(getattr(exc, "exit_status", FAILED)) from None


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run_command(cfg)


def hoist_multirun_flag(argv: list[str]) -> list[str]:
    """Let ``-m`` and Hydra's other flags stand anywhere (``... task=pinn -m seed=0,1``):
    Hydra's parser needs them before the overrides on Python < 3.12, where argparse cannot
    split positionals around a flag."""
    return [argv[0], *split(argv[1:]).hoisted()]


if __name__ == "__main__":
    # flags, grammar, names, YAML, keys and a sweep's jobs: one line each, where Hydra would
    # print a usage block, its grammar's tokens, a traceback or suggest `+field=`
    if found := problem(sys.argv[1:]):
        print(found, file=sys.stderr, flush=True)
        sys.exit(MISTAKE)
    sys.argv = hoist_multirun_flag(sys.argv)
    main()
