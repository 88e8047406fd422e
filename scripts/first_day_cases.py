"""A researcher's first-day mistakes through the real command lines: each case's seconds, exit
status and the lines it printed to stderr (one line expected, none for a finished re-run).

    .venv/bin/python scripts/first_day_cases.py [--only SUBSTRING] [--repeat N]

Run from the repository root. Builds what the cases need in a temporary folder (a copy of
atlas/ and conf/ with a broken draft experiment, a scaffolded task, local servers that refuse
or never answer, a run folder held by another process, a finished run) and removes it after.
Times are wall seconds of the whole command, Python's start-up included; they are only
comparable on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case; the median time is shown (default 1)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="atlas-first-day-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    base.update(WANDB_MODE="offline", WANDB_SILENT="true", HF_HOME=str(tmp / "hf"),
                NETRC=str(tmp / "no-netrc"), WANDB_CONFIG_DIR=str(tmp / "wandb-config"))
    silent = socket.socket()  # accepts (the kernel's backlog), never answers over HTTP
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    full = socket.socket()  # its accept queue full: a TCP connection is never accepted
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    filler = socket.create_connection(full.getsockname())
    full_url = f"http://127.0.0.1:{full.getsockname()[1]}"

    # a copy of atlas/ and conf/ with a broken draft experiment
    copy = tmp / "copy"
    for name in ("atlas", "conf"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "conf" / "experiment" / "draft.yaml").write_text(
        "# @package _global_\nexplore: {rounds: [1, 2}\n")
    mine = tmp / "mine" / "experiment"
    mine.mkdir(parents=True)
    (mine / "broken.yaml").write_text("# @package _global_\nexplore:\n  temperatures: [1,\n")
    (mine / "tab.yaml").write_text("# @package _global_\nexplore:\n\trounds: 3\n")
    (mine / "nohead.yaml").write_text("explore:\n  rounds: 3\n")
    (mine / "interp.yaml").write_text("# @package _global_\nexplore:\n  rounds: ${nothere}\n")
    # a scaffolded task, a program without its entry point, a seed without it
    subprocess.run([PY, "-m", "atlas.tasks", "new", "dayone", "--dir", str(tmp)], check=True,
                   capture_output=True, cwd=ROOT)
    shutil.copytree(tmp / "dayone", tmp / "centre")
    init = tmp / "centre" / "__init__.py"
    init.write_text(init.read_text().replace("def estimate(xs):\n    \"\"\"The sample mean",
                                             "def estimate_centre(xs):\n    \"\"\"The sample mean"))
    for path in (tmp / "centre").rglob("*"):
        if path.is_file():
            path.write_text(path.read_text().replace("dayone", "centre").replace("Dayone",
                                                                                  "Centre"))
    (tmp / "centre" / "conf" / "task" / "dayone.yaml").rename(
        tmp / "centre" / "conf" / "task" / "centre.yaml")
    prog = tmp / "prog.py"
    prog.write_text("import numpy as np\n\n\ndef estimate_centre(xs):\n"
                    "    return float(np.median(xs))\n")
    task_env = {**base, "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)])}
    # a run folder held by another process
    held = tmp / "held"
    holder = subprocess.Popen([PY, "-c", "import sys, time; from atlas.runfolder import locked;"
                               " cm = locked(sys.argv[1]); cm.__enter__(); print('held', "
                               "flush=True); time.sleep(600)", str(held)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    held.mkdir()
    holder.stdout.readline()
    afile = tmp / "afile"
    afile.write_text("not a folder")
    # a finished run
    finished = tmp / "finished"
    subprocess.run([PY, "-m", "atlas.train", "experiment=test", "progress=false",
                    f"hydra.run.dir={finished}"], cwd=ROOT, env=base, check=True,
                   capture_output=True)

    # PATHs without SLURM, and with a controller that does not answer
    no_slurm = tmp / "no-slurm-bin"
    no_slurm.mkdir()
    slurm_down = tmp / "slurm-down-bin"
    slurm_down.mkdir()
    for tool, said, status in (("sbatch", "", 0), ("srun", "", 0), (
            "sinfo", "sinfo: error: Unable to contact slurm controller (connect failure)", 1)):
        (slurm_down / tool).write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {status}\n")
        (slurm_down / tool).chmod(0o755)

    train = [PY, "-m", "atlas.train"]
    run = f"hydra.run.dir={tmp / 'run'}"
    online = {**base, "WANDB_API_KEY": "k" * 40}
    online.pop("WANDB_MODE")
    cases = [
        ("seed=abc", train + ["experiment=test", "seed=abc", run], base, ROOT),
        ("-m seed=0, 1", train + ["-m", "seed=0,", "1"], base, ROOT),
        ("explore.temperatures=[1, 2]", train + ["explore.temperatures=[1,", "2]", run], base,
         ROOT),
        ("name=my run", train + ["name=my", "run", run], base, ROOT),
        ("seed = 3", train + ["seed", "=", "3", run], base, ROOT),
        ("a bare option: pinn", train + ["pinn", run], base, ROOT),
        ("--rounds 3", train + ["--rounds", "3", run], base, ROOT),
        ("--seed=3", train + ["--seed=3", run], base, ROOT),
        ("-m and --cfg", train + ["-m", "seed=0", "--cfg", "job"], base, ROOT),
        ("methd=atlas", train + ["methd=atlas", run], base, ROOT),
        ("method=atlass", train + ["method=atlass", run], base, ROOT),
        ("dpo.betta=0.1", train + ["dpo.betta=0.1", run], base, ROOT),
        ("sweep job seed=-1", train + ["-m", "experiment=test", "seed=0,-1"], base, ROOT),
        ("explore.beta=0.2", train + ["explore.beta=0.2", run], base, ROOT),
        ("model=qwen2", train + ["model=qwen2", run], base, ROOT),
        ("model=<a folder>", train + [f"model={tmp}", run], base, ROOT),
        ("SLURM sweep, no SLURM on PATH", train + ["-m", "seed=0,1", "hydra/launcher=slurm"],
         {**base, "PATH": str(no_slurm)}, tmp),
        ("SLURM sweep, controller down", train + ["-m", "seed=0,1", "hydra/launcher=slurm"],
         {**base, "PATH": str(slurm_down)}, tmp),
        ("an unused broken draft; seed=abc",
         train + ["experiment=test", "seed=abc", run], {**base, "PYTHONPATH": str(copy)}, copy),
        ("the broken draft used", train + ["experiment=draft", run],
         {**base, "PYTHONPATH": str(copy)}, copy),
        ("the broken draft in a sweep", train + ["-m", "experiment=test,draft"],
         {**base, "PYTHONPATH": str(copy)}, copy),
        ("--config-dir: an unclosed bracket",
         train + ["--config-dir", str(mine.parent), "experiment=broken", run], base, ROOT),
        ("hydra.searchpath: a tab",
         train + [f"hydra.searchpath=[file://{mine.parent}]", "experiment=tab", run], base, ROOT),
        ("an experiment without @package", train + ["--config-dir", str(mine.parent),
                                                    "experiment=nohead", run], base, ROOT),
        ("an interpolation to nothing", train + ["--config-dir", str(mine.parent),
                                                 "experiment=interp", run], base, ROOT),
        ("--config-dir not there", train + ["--config-dir", str(tmp / "none"),
                                            "experiment=x", run], base, ROOT),
        ("W&B online, no key", train + ["experiment=test", "logger=wandb", "logger.mode=online",
                                        run], {k: v for k, v in online.items()
                                               if k != "WANDB_API_KEY"}, ROOT),
        ("W&B online, server refuses", train + ["experiment=test", "logger=wandb",
                                                "logger.mode=online", run],
         {**online, "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}, ROOT),
        ("W&B online, server silent", train + ["experiment=test", "logger=wandb",
                                               "logger.mode=online", run],
         {**online, "WANDB_BASE_URL": silent_url}, ROOT),
        ("WANDB_MODE=online, no network", train + ["experiment=test", "logger=wandb", run],
         {**online, "WANDB_MODE": "online"}, ROOT),
        ("hub id, name not found", train + ["experiment=test", "model=llama3_1b",
                                            "model.name_or_path=org/none", run],
         {**base, "HF_ENDPOINT": "https://no-such-host.invalid"}, ROOT),
        ("hub id, hub silent", train + ["experiment=test", "model=llama3_1b",
                                        "model.name_or_path=org/none", run],
         {**base, "HF_ENDPOINT": full_url}, ROOT),
        ("run folder in use", train + ["experiment=test", f"hydra.run.dir={held}"], base, ROOT),
        ("run folder unwritable", train + ["experiment=test", f"hydra.run.dir={afile}/sub"],
         base, ROOT),
        ("a finished run re-run", train + ["experiment=test", "progress=false",
                                           f"hydra.run.dir={finished}"], base, ROOT),
        ("atlas.score: no entry point", [PY, "-m", "atlas.score", "task=dayone",
                                         "hydra.searchpath=[pkg://dayone.conf]", str(prog)],
         task_env, tmp),
        ("atlas.tasks check: seed estimate_centre",
         [PY, "-m", "atlas.tasks", "check", "task=centre", "hydra.searchpath=[pkg://centre.conf]",
          "--secrets", "1"], task_env, tmp),
        ("atlas.score: the broken draft", [PY, "-m", "atlas.score", "experiment=draft",
                                           str(prog)], {**base, "PYTHONPATH": str(copy)}, copy),
    ]
    print(f"{'case':44} {'exit':>4} {'s':>6}  stderr lines / the line")
    try:
        for name, cmd, env, cwd in cases:
            if args.only not in name:
                continue
            times = []
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                     timeout=600)
                times.append(time.perf_counter() - t0)
            took = statistics.median(times)
            lines = [x for x in out.stderr.splitlines() if x.strip() and "[INFO]" not in x]
            if name.startswith("atlas.tasks check"):
                lines = [x for x in out.stdout.splitlines() if x.startswith("FAIL")]
            if name.startswith("atlas.score: no entry"):
                lines = [x.strip() for x in out.stdout.splitlines() if "FAILED" in x]
            shown = lines[0] if len(lines) == 1 else f"{len(lines)} lines"
            print(f"{name:44} {out.returncode:>4} {took:6.2f}  {shown[:150]}", flush=True)
    finally:
        holder.kill()
        filler.close()
        full.close()
        silent.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
