"""A sweep (``python -m atlas.train -m ...``) checked before anything is launched.

Why: ``validate`` runs inside each job, so a bad value in one job of a SLURM sweep showed only
after the queue wait, and a request no node can meet (the preset's CPUs or memory on a small
node) left the jobs pending with nothing but ``sacct`` warnings. Here every job's config is
composed and validated first (the same ``atlas.config.validate`` the job runs), each supporter
server gets its health request once, and a SLURM request is compared with what ``sinfo`` says
the partition's nodes have. A busy cluster is not an error: only a node's size is compared.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from atlas.compose import CONF, compose
from atlas.config import validate
from atlas.schema import ConfigError

#: seconds ``sinfo`` may take (a cluster whose controller is down makes it retry for ~20 s)
SINFO_TIMEOUT_S = 10.0


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands them (``seed=0,1`` -> two jobs)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def with_sweeper_params(overrides: Sequence[str]) -> list[str]:
    """The command line's overrides after those of ``hydra.sweeper.params`` in the config it
    composes (``experiment=study`` fixes its seeds there), as Hydra's basic sweeper orders
    them: a key on the command line wins over the config's."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    jobs = sweep_jobs(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = hydra_compose("train", overrides=list(jobs[0]), return_hydra_config=True)
    except Exception:  # noqa: BLE001 - a job that does not compose: check_sweep names it
        return list(overrides)
    params = cfg.hydra.sweeper.get("params") or {}
    return [*(f"{k}={v}" for k, v in params.items()), *overrides]


def _describe(job: Sequence[str], swept: set[str]) -> str:
    return " ".join(o for o in job if o.split("=", 1)[0] in swept) or " ".join(job)


def check_sweep(overrides: Sequence[str]) -> str | None:
    """One line for the first job of the sweep that would fail at start, or for a SLURM request
    no node can meet; None when every job is valid. Leaves sweeps with another sweeper (their
    jobs are not known in advance) and ``--config-dir`` runs to Hydra."""
    if any(o.split("=", 1)[0] == "hydra/sweeper" or o.startswith("-") for o in overrides):
        return None
    try:
        overrides = with_sweeper_params(overrides)
        jobs = sweep_jobs(overrides)
    except Exception as exc:  # noqa: BLE001 - a grammar error: Hydra's own line says it better
        return " ".join(str(exc).split()) or None
    swept = {o.split("=", 1)[0] for o in overrides if "," in o.split("=", 1)[-1]}
    checked: set[str] = set()
    for i, job in enumerate(jobs, 1):
        where = f"sweep job {i} of {len(jobs)} ({_describe(job, swept)})"
        try:
            cfg = compose(job)
            settings = validate(cfg, job, sweep=True)
            if settings.supporters:
                urls = {r.base_url for r in settings.supporters.values() if r.backend == "openai"}
                if urls - checked:
                    # deferred: the supporters' package, for sweeps that run a server
                    from atlas.supporters.health import check_supporters

                    check_supporters(settings.supporters)
                    checked |= urls
        except (ConfigError, ValueError, TypeError) as exc:
            return f"{where}: {exc}; nothing was launched"
    if jobs:
        return launcher_problem(jobs[0])
    return None


#: the ways out of a sweep that SLURM cannot take, for every line that refuses one
SLURM_WAYS_OUT = ("start a local controller (sudo bash scripts/slurm_local.sh start), run the "
                  "sweep here without the launcher (drop hydra/launcher=slurm: the jobs run one "
                  "after another), or as local processes (hydra/launcher=submitit_local)")

#: sbatch options for the preset's fields that shape a request (``--test-only`` checks them)
_SBATCH_FIELDS = (("partition", "--partition"), ("cpus_per_task", "--cpus-per-task"),
                  ("tasks_per_node", "--ntasks-per-node"), ("nodes", "--nodes"),
                  ("gpus_per_node", "--gpus-per-node"), ("constraint", "--constraint"),
                  ("qos", "--qos"), ("account", "--account"), ("exclude", "--exclude"))


def launcher_problem(job: Sequence[str]) -> str | None:
    """For ``hydra/launcher=slurm``: one line when the jobs cannot be submitted (no ``sbatch``
    or ``srun`` on PATH, a controller ``sinfo`` cannot reach, ``sbatch --test-only`` refusing
    the request) or when no node of the partition has the CPUs and memory a job asks for;
    None otherwise (another launcher, or a request the cluster takes). Why here: submitit
    would announce the jobs, write ``.submitit/``, retry for ~20 s and end in a traceback."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose("train", overrides=list(job), return_hydra_config=True)
    launcher = cfg.hydra.launcher
    if "SlurmLauncher" not in str(launcher.get("_target_", "")):
        return None
    if found := slurm_reach_problem():
        return found
    nodes = slurm_nodes(launcher.get("partition"))
    if nodes and (found := _size_problem(launcher, nodes)):
        return found
    return sbatch_problem(launcher)


def refusal(cause: str, fix: str = "") -> str:
    return (f"hydra/launcher=slurm cannot submit here: {cause}; {fix}{SLURM_WAYS_OUT}; nothing "
            f"was submitted")


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no message"])[0]


def slurm_reach_problem() -> str | None:
    """One line when SLURM's commands are missing or its controller does not answer ``sinfo``
    within ``SINFO_TIMEOUT_S``; None when both tools are there and ``sinfo`` answers."""
    missing = [t for t in ("sbatch", "srun") if shutil.which(t) is None]
    if missing:
        return refusal(f"no SLURM on this machine ({' and '.join(missing)} "
                       f"{'is' if len(missing) == 1 else 'are'} not on PATH)")
    if shutil.which("sinfo") is None:
        return None  # sbatch --test-only asks the controller instead
    said = _ask(["sinfo", "-h", "-o", "%P"], "the SLURM controller did not answer sinfo")
    if said is None:
        return None
    return refusal(said if not said.startswith("sinfo: ")
                   else f"the SLURM controller does not answer ({said})")


def _ask(cmd: list[str], silent: str) -> str | None:
    """Run a SLURM command: None when it succeeds, else why in words: ``silent`` plus the
    timeout when it got no answer, "<tool> could not run (...)", or "<tool>: <its first line>"."""
    tool = cmd[0]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{silent} within {SINFO_TIMEOUT_S:g} s (is slurmctld running?)"
    except OSError as exc:
        return f"{tool} could not run ({exc.strerror or exc})"
    if out.returncode != 0:
        return f"{tool}: " + first_line(out.stderr + out.stdout).removeprefix(f"{tool}: ")
    return None


def sbatch_problem(launcher: Any) -> str | None:
    """One line when ``sbatch --test-only`` (which asks the controller but submits nothing)
    refuses a job's request, naming sbatch's reason; None when it would take it."""
    cmd = ["sbatch", "--test-only", "--output=/dev/null", "--wrap=true",
           f"--time={int(launcher.get('timeout_min') or 60)}"]
    for field, flag in _SBATCH_FIELDS:
        if launcher.get(field) is not None:
            cmd.append(f"{flag}={launcher.get(field)}")
    if launcher.get("mem_gb") is not None:
        cmd.append(f"--mem={launcher.get('mem_gb')}G")
    for key, value in (launcher.get("additional_parameters") or {}).items():
        if value is True:
            cmd.append(f"--{key}")
        elif value not in (False, None):
            cmd.append(f"--{key}={value}")
    said = _ask(cmd, "sbatch got no answer from the SLURM controller")
    if said is None:
        return None
    if not said.startswith("sbatch: "):
        return refusal(said)
    return refusal(f"sbatch refuses the jobs' request ({said})",
                   "fix the hydra.launcher field it names (docs/cli.md, 'Sweeps and SLURM'), ")


def _size_problem(launcher: Any, nodes: list[tuple[int, float]]) -> str | None:
    """One line when no node has the CPUs and memory a job asks for (the jobs would pend)."""
    cpus, mem_gb = launcher.get("cpus_per_task") or 1, launcher.get("mem_gb")
    tasks = launcher.get("tasks_per_node") or 1
    need_cpus = int(cpus) * int(tasks)
    if any(c >= need_cpus and (mem_gb is None or m >= float(mem_gb)) for c, m in nodes):
        return None
    big_c, big_m = max(nodes, key=lambda n: (n[0], n[1]))
    where = f"partition {launcher.partition}" if launcher.get("partition") else "the cluster"
    return (f"hydra.launcher.cpus_per_task={cpus} and hydra.launcher.mem_gb={mem_gb} fit no node "
            f"of {where} (sinfo: the largest has {big_c} CPUs and {big_m:.1f} GB), so the jobs "
            f"would stay pending; lower them, e.g. hydra.launcher.cpus_per_task="
            f"{min(int(cpus), big_c)} hydra.launcher.mem_gb={min(float(mem_gb or 4), 4.0, big_m):g}"
            f" (a job's measured needs: docs/cli.md, 'Sweeps'); nothing was submitted")


def slurm_nodes(partition: Any = None) -> list[tuple[int, float]]:
    """``(CPUs, memory GB)`` of each node ``sinfo`` lists (of ``partition`` when given); empty
    when there is no ``sinfo`` or it does not answer in ``SINFO_TIMEOUT_S``."""
    if shutil.which("sinfo") is None:
        return []
    cmd = ["sinfo", "-h", "-N", "-o", "%c %m"] + (["-p", str(partition)] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return []
    nodes = []
    for line in out.stdout.splitlines():
        parts = line.split()
        try:
            nodes.append((int(parts[0].rstrip("+")), float(parts[1].rstrip("+")) / 1024))
        except (IndexError, ValueError):
            continue
    return nodes
