"""``hydra/launcher=slurm``'s launcher: hydra-submitit-launcher's own, with a submission that
``sbatch`` refuses ended in one line.

Why: ``atlas.sweep`` asks ``sbatch --test-only`` before anything is launched, but a limit
counted only at submission (an array larger than ``MaxArraySize``, a QOS job cap) passes that
test. submitit then printed sbatch's error, a traceback and left ``.submitit/`` behind.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher


@contextlib.contextmanager
def _quiet_commands() -> Iterator[None]:
    """submitit echoes a failed command's stderr before raising it; the refusal line quotes it."""
    from submitit.core import utils

    call = utils.CommandFunction.__call__

    def quiet(self: Any, *args: Any, **kwargs: Any) -> str:
        with contextlib.redirect_stderr(io.StringIO()):
            return call(self, *args, **kwargs)

    utils.CommandFunction.__call__ = quiet
    try:
        yield
    finally:
        utils.CommandFunction.__call__ = call


def _sbatch_refusal(exc: BaseException) -> str | None:
    """sbatch's first line when ``exc`` is a refused ``sbatch`` submission, else None."""
    from atlas.sweep import first_line

    cause = exc.__cause__
    if isinstance(cause, subprocess.CalledProcessError) and cause.cmd and \
            Path(str(cause.cmd[0])).name == "sbatch":
        return "sbatch: " + first_line(str(cause.stderr or exc)).removeprefix("sbatch: ")
    return None


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """submitit's SLURM launcher; a refused submission is one line with status 2, and the
    ``.submitit/`` folder (and a sweep folder holding nothing else) it wrote is removed."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from submitit.core.utils import FailedJobError

        # deferred: Hydra imports every plugin module when it starts
        from atlas.commandline import MISTAKE
        from atlas.sweep import refusal

        assert self.config is not None
        sweep = Path(str(self.config.hydra.sweep.dir))
        marks = sweep / ".submitit"
        had_marks = marks.exists()
        try:
            with _quiet_commands():
                return super().launch(job_overrides, initial_job_idx)
        except FailedJobError as exc:
            said = _sbatch_refusal(exc)
            if said is None:
                raise
            if not had_marks:
                shutil.rmtree(marks, ignore_errors=True)
            if sweep.is_dir() and {p.name for p in sweep.iterdir()} <= {"multirun.yaml"}:
                shutil.rmtree(sweep, ignore_errors=True)
                with contextlib.suppress(OSError):
                    sweep.parent.rmdir()  # multirun/ when nothing else is there
            print(refusal(f"sbatch refused the submission ({said})",
                          "fix the hydra.launcher field it names (docs/cli.md, 'Sweeps and "
                          "SLURM'), "), file=sys.stderr, flush=True)
            raise SystemExit(MISTAKE) from None
