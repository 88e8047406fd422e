"""Compose-based tests of the config tree (lightning-hydra-template style)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from atlas.config import ConfigError, validate
from tests.conftest import ROOT, compose_cfg


@pytest.mark.parametrize("task", ["bandit", "pinn"])
@pytest.mark.parametrize("method", ["evotune", "evodpo", "atlas"])
def test_every_task_and_method_composes_and_validates(task: str, method: str) -> None:
    cfg = compose_cfg([f"task={task}", f"method={method}"])
    validate(cfg)
    assert cfg.task.name == task and cfg.method.name == method
    expected = {"evotune": ("fixed", False, False), "evodpo": ("adaptive", False, False),
                "atlas": ("adaptive", True, True)}[method]
    assert (cfg.method.reference, cfg.method.gate, cfg.method.supporters) == expected


def test_defaults_run_on_cpu_with_the_default_agent() -> None:
    cfg = compose_cfg()
    assert cfg.model.source == "smollm2" and cfg.device == "auto"
    assert cfg.explore.islands == 6
    assert cfg.explore.rounds // cfg.explore.phase_every >= 2  # at least two fine-tuning phases
    assert cfg.supporters.backend == "embedded" and cfg.logger.mode == "offline"


def test_paper_experiment_values() -> None:
    cfg = compose_cfg(["experiment=paper", "method=atlas"])
    assert cfg.explore.islands == 6 and cfg.explore.phase_every == 20
    assert set(cfg.explore.temperatures) == {0.9}
    assert cfg.model.source == "hf" and "Llama-3.2-1B-Instruct" in cfg.model.name_or_path
    assert cfg.model.dtype == "bfloat16" and cfg.device == "cuda"
    assert cfg.supporters.exploration.model == "gpt-oss:120b"
    assert cfg.supporters.strategist.model == "deepseek-r1:32b"
    assert cfg.supporters.inspector.model == "llama4:latest"
    assert {cfg.supporters[r].temperature for r in ("exploration", "strategist", "inspector")} == {0.7}
    bandit = compose_cfg(["experiment=paper", "task=bandit"]).task
    assert (bandit.K, bandit.d, bandit.T) == (5, 5, 2000)
    pinn = compose_cfg(["experiment=paper", "task=pinn"]).task
    assert (pinn.n_steps, pinn.depth, pinn.width) == (500, 4, 32)


def test_unknown_group_option_fails_with_its_name() -> None:
    with pytest.raises(ConfigCompositionException, match="nosuchtask"):
        compose_cfg(["task=nosuchtask"])


def test_wrong_override_key_fails_with_its_name() -> None:
    with pytest.raises(ConfigCompositionException, match="not_a_field"):
        compose_cfg(["dpo.not_a_field=3"])


@pytest.mark.parametrize("override,field", [
    ("method.reference=sometimes", "method.reference"),
    ("dpo.beta=-1", "dpo.beta"),
    ("explore.islands=8", "explore.temperatures"),
    ("model.source=hf", "model.name_or_path"),
])
def test_invalid_values_name_the_field(override: str, field: str) -> None:
    cfg = compose_cfg([override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(cfg)


def test_unknown_task_name_is_rejected() -> None:
    cfg = compose_cfg()
    with open_dict(cfg):
        cfg.task.name = "chemistry"
    with pytest.raises(ConfigError, match="known tasks"):
        validate(cfg)


def test_cli_help_and_cfg_job_work() -> None:
    for args in (["--help"], ["--cfg", "job", "method=atlas", "task=pinn"]):
        out = subprocess.run([sys.executable, "-m", "atlas.train", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.method.name == "atlas" and cfg.task.name == "pinn"


def test_cli_wrong_override_fails_at_start_with_a_message() -> None:
    out = subprocess.run([sys.executable, "-m", "atlas.train", "task=nosuchtask"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "nosuchtask" in out.stderr and "task" in out.stderr


# ---- runs never lie about their configuration (issue 12, item 5) -----------------------------
@pytest.mark.parametrize("override,field,fix", [
    ("+explore.roundz=3", "explore.roundz", "explore.rounds"),
    ("+model.lora_rr=4", "model.lora_rr", "model.lora_r"),
    ("+supporters.exploration.max_tokenz=9", "supporters.exploration.max_tokenz",
     "supporters.exploration.max_tokens"),
    ("+sed=1", "sed", "seed"),
])
def test_keys_added_with_plus_must_exist(override: str, field: str, fix: str) -> None:
    """Hydra accepts any ``+key``; a key no option of conf/ defines is read by nothing."""
    cfg = compose_cfg(["experiment=test", override])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert f"{field} is not a known field" in str(err.value)
    assert f"did you mean {fix}?" in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["method=atlas", "supporters=openai", "supporters.model=m", "+supporters.exploration.max_tokens=192"],
    ["+dpo.bounds.top_k=[1,8]"],
    ["+hydra.job.env_set.ATLAS_X=1", "hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
])
def test_legitimate_additions_still_validate(overrides: list[str]) -> None:
    """A role block may repeat any shared supporters key; dpo.bounds takes any DPO knob
    (DPOConfig checks the name); Hydra's own ``hydra.*`` is not part of the job's config."""
    validate(compose_cfg(["experiment=test", *overrides]))


def test_name_or_path_is_rejected_when_the_source_ignores_it(tmp_path) -> None:
    cfg = compose_cfg(["experiment=test", "model.name_or_path=/models/llama"])
    with pytest.raises(ConfigError, match=r"model\.name_or_path='/models/llama' is ignored with "
                                          r"model\.source=tiny; set model\.source=hf"):
        validate(cfg)
    (tmp_path / "config.json").write_text("{}")  # a saved model folder (availability.py)
    (tmp_path / "model.safetensors").write_bytes(b"")
    validate(compose_cfg(["experiment=test", "model.source=hf", f"model.name_or_path={tmp_path}"]))


def test_dpo_knob_outside_its_bounds_fails_at_start() -> None:
    """DPO clamps knobs into dpo.bounds: dpo.beta=5 would train at 2 while the config event,
    W&B and .hydra/config.yaml said 5. A value given in the config is refused instead."""
    with pytest.raises(ConfigError, match=r"dpo\.beta=5\.0 is outside dpo\.bounds\.beta = "
                                          r"\[0\.01, 2\] \(DPO would train at 2\.0\)"):
        validate(compose_cfg(["experiment=test", "dpo.beta=5"]))
    with pytest.raises(ConfigError, match=r"dpo\.epochs=9 is outside dpo\.bounds\.epochs"):
        validate(compose_cfg(["experiment=test", "dpo.epochs=9"]))
    validate(compose_cfg(["experiment=test", "method=evotune", "dpo.beta=5",
                          "dpo.bounds.beta=[0.01,10]"]))  # no strategist: its limits do not bind
    with pytest.raises(ConfigError, match=r"dpo\.bounds\.beta=\[0\.01, 10\] exceeds the "
                                          r"strategist's limits \[0\.01, 2\]"):
        validate(compose_cfg(["experiment=test", "method=atlas", "dpo.bounds.beta=[0.01,10]"]))


@pytest.mark.parametrize("override,message", [
    ("seed=abc", "seed='abc' must be an integer; set e.g. seed=0"),
    ("resume=maybe", "resume='maybe' must be true or false"),
    ("dpo.max_length=long", "dpo.max_length must be an integer, got 'long'"),
    ("gate.lam=x", "gate.lam must be a number, got 'x'"),
])
def test_bad_values_name_their_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(["experiment=test", override]))
    assert message in str(err.value)


def test_cli_config_errors_are_one_line_without_a_traceback(tmp_path) -> None:
    """An unwritable run folder (a path under a regular file fails for root too) and an
    unknown ``+`` key: a message naming the path or key and the fix, no traceback."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    out = subprocess.run([sys.executable, "-m", "atlas.train", "experiment=test",
                          f"hydra.run.dir={afile}/sub"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [f"Error: cannot write the run folder {afile}/sub: Not a directory "
                     f"({afile} is a file); choose a writable folder with hydra.run.dir=<dir> (or "
                     f"run_dir=<dir>, hydra.sweep.dir=<dir> for -m), or run from a writable "
                     f"working directory"], out.stderr
    out = subprocess.run([sys.executable, "-m", "atlas.train", "experiment=test",
                          "+explore.roundz=3", f"hydra.run.dir={tmp_path}/run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert any(line.startswith("unknown explore field(s) ['roundz']: explore.roundz is not a "
                               "known field") and line.endswith("did you mean explore.rounds? (a "
                               "key added with `+explore.roundz=...` is read by nothing)")
               for line in out.stderr.splitlines()), out.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_logger_is_built_from_its_target_and_a_bad_target_names_the_field(tmp_path) -> None:
    """logger=wandb instantiates its `_target_` factory; logger=none builds nothing; an
    unimportable `_target_` fails naming `logger._target_` (tests/test_wandb.py runs the W&B
    path end to end, tests/test_task_contract.py a package's own CSV logger)."""
    from atlas.loggers import make_logger

    none = compose_cfg(["experiment=test"], run_dir=tmp_path)
    assert none.logger.name == "none" and validate(none).logger is None
    assert make_logger(None, tmp_path, {}) is None
    wb = validate(compose_cfg(["experiment=test", "logger=wandb"], run_dir=tmp_path)).logger
    assert wb is not None and wb.target == "atlas.loggers.wandb_logger"
    assert dict(wb.fields) == {"name": "wandb", "mode": "offline", "project": "atlas",
                               "entity": None, "group": None}
    bad = compose_cfg(["experiment=test", "logger=wandb", "logger._target_=nopkg.Logger"],
                      run_dir=tmp_path)
    with pytest.raises(ValueError, match=r"logger._target_='nopkg.Logger' cannot be imported"):
        make_logger(validate(bad).logger, tmp_path, {})


# ---- errors before heavy imports, in one line (issue 22, item 6) ------------------------------
def _cli(*overrides: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atlas.train", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_validation_imports_neither_torch_nor_lightning() -> None:
    """A mistyped value must fail in a second or two: validation builds every schema
    (atlas.dpo.config included) without importing torch, Lightning or transformers."""
    code = ("import sys; from tests.conftest import compose_cfg; from atlas.config import "
            "validate; validate(compose_cfg(['experiment=test', 'method=atlas'])); "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers', 'peft') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_typo_fails_before_torch_is_imported(tmp_path) -> None:
    """The command line itself: ``-X importtime`` lists every module imported before exit."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "atlas.train",
                          "experiment=test", "seed=abc", f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert errors == ["seed='abc' must be an integer; set e.g. seed=0"], errors
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "hydra" in imported and not imported & {"torch", "lightning", "transformers"}


@pytest.mark.parametrize("overrides,line", [
    (["method=evotune", "gate.epsilon=0.5", "gate.delta=0.2"],
     "gate.epsilon=0.5, gate.delta=0.2 have no effect with method=evotune: its reference is "
     "fixed (method.reference=fixed), so no gate runs; drop them, or run a gated method (method=atlas, "
     "or method.reference=adaptive method.gate=true)"),
    (["model.source=hf", "model.name_or_path=/nonexistent/llama"],
     "model.name_or_path='/nonexistent/llama' is not a folder; point it at a saved Hugging Face "
     "model folder (config.json and weights) or use a hub id"),
    (["sandbox.secret_file=/nonexistent/typo.secret"],
     "sandbox.secret_file='/nonexistent/typo.secret' does not exist: a mistyped path would give "
     "this run a fresh secret, and scores not comparable with the runs it was meant to match; "
     "fix the path, or set sandbox.create_secret=true to create a new shared secret there"),
])
def test_cli_file_and_ignored_setting_errors_are_one_line(tmp_path, overrides, line) -> None:
    out = _cli("experiment=test", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [line], out.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()
    assert not (tmp_path / "run" / ".task_secret").exists()


def test_cli_device_cuda_without_a_gpu_is_one_line(tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = _cli("experiment=test", "device=cuda", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "device=cuda but torch sees no GPU (torch.cuda.is_available() is false); use "
        "device=cpu or device=auto, or install a CUDA build of torch on a machine with a GPU"]
    assert not (tmp_path / "events.jsonl").exists()
    assert "device=cuda but torch sees no GPU" in (tmp_path / "train.log").read_text()


def test_gate_settings_a_method_never_reads_are_refused_by_name(caplog) -> None:
    """EvoTune: no gate runs (fixed reference), every gate.* is refused. EvoDPO: the gate is
    measured for the record but always accepts, so only the fields that decide are refused.
    A sweep shares one override line between its methods: a warning there."""
    def check(method: str, typed: list[str], sweep: bool = False) -> None:
        validate(compose_cfg(["experiment=test", f"method={method}", *typed]),
                 [f"method={method}", *typed], sweep=sweep)

    with pytest.raises(ConfigError, match=r"^gate\.subset_size=2 has no effect with "
                                          r"method=evotune: its reference is fixed"):
        check("evotune", ["gate.subset_size=2"])
    with pytest.raises(ConfigError, match=r"^gate\.holdout=0\.3 has no effect with method=evodpo"
                                          r": it promotes every phase \(method\.gate=false\)"):
        check("evodpo", ["gate.subset_size=2", "gate.holdout=0.3"])
    check("evodpo", ["gate.subset_size=2", "gate.max_length=512"])  # they shape its record
    check("atlas", ["gate.epsilon=0.5", "gate.delta=0.2"])
    check("evotune", [])  # the experiment's own gate.subset_size was not typed
    with caplog.at_level("WARNING", logger="atlas.config"):
        check("evotune", ["gate.epsilon=0.05"], sweep=True)
    assert "gate.epsilon=0.05 has no effect with method=evotune" in caplog.text
    assert "every job of this sweep shares the override" in caplog.text


def test_a_missing_secret_file_is_created_only_when_asked(tmp_path) -> None:
    from atlas.sandbox.secret import run_secret

    shared = tmp_path / "typo" / "task.secret"
    with pytest.raises(ConfigError, match=r"sandbox\.secret_file=.* does not exist"):
        validate(compose_cfg(["experiment=test", f"sandbox.secret_file={shared}"]))
    with pytest.raises(FileNotFoundError, match="sandbox.create_secret=true"):
        run_secret(tmp_path / "run", str(shared))
    assert not shared.exists() and not (tmp_path / "run" / ".task_secret").exists()
    validate(compose_cfg(["experiment=test", f"sandbox.secret_file={shared}",
                          "sandbox.create_secret=true"]))
    value = run_secret(tmp_path / "run", str(shared), create=True)
    assert shared.read_text().strip() == value and len(value) == 64
    validate(compose_cfg(["experiment=test", f"sandbox.secret_file={shared}"]))  # exists now
    assert run_secret(tmp_path / "run2", str(shared)) == value


@pytest.mark.parametrize("create", [False, True])
def test_a_secret_file_that_is_a_folder_is_one_line_naming_the_field(tmp_path, create) -> None:
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["experiment=test", f"sandbox.secret_file={tmp_path}",
                              f"sandbox.create_secret={str(create).lower()}"]))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"sandbox.secret_file='{tmp_path}' is a folder")
    assert "the file that holds the secret" in msg


def test_a_secret_file_without_a_secret_is_one_line_naming_the_field(tmp_path) -> None:
    bad = tmp_path / "secret.bin"
    bad.write_bytes(bytes(range(32)))  # raw bytes, not the 64 hex characters a run keeps
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["experiment=test", f"sandbox.secret_file={bad}"]))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"sandbox.secret_file='{bad}' holds no task secret")
    assert "secrets.token_hex(32)" in msg
    bad.write_text(bytes(range(32)).hex() + "\n")  # the fix the line gives
    validate(compose_cfg(["experiment=test", f"sandbox.secret_file={bad}"]))


@pytest.mark.parametrize("override,fix", [("dpo.betta=0.1", "did you mean dpo.beta?"),
                                          ("explore.roundz=3", "did you mean explore.rounds?")])
def test_cli_mistyped_field_is_one_line_with_the_closest_field(tmp_path, override, fix) -> None:
    """Hydra alone rejects a field no YAML defines in four lines that suggest ``+field=``, which
    adds a key nothing reads; the command line names the field and the closest known one."""
    out = _cli("experiment=test", override, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"unknown {override.split('.')[0]} field(s)")
    assert fix in lines[0] and "Could not override" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_override_check_leaves_added_open_and_foreign_keys_to_later_checks() -> None:
    from atlas.compose import override_problem

    assert override_problem(["gate.epsilon=0.1", "dpo.bounds.beta=[0.1,1]", "+dpo.extra=1",
                             "supporters.exploration.max_tokens=5", "experiment=paper",
                             "hydra.run.dir=/tmp/x"]) is None
    assert "task.arms is not a known field" in override_problem(["task.arms=3"])
    assert override_problem(["hydra.searchpath=[pkg://mytasks.conf]", "task=mine",
                             "task.arms=3"]) is None
