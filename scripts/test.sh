#!/usr/bin/env bash
# The project's test command (README, .ci/run): set up, start the local SLURM test cluster
# when we are root, lint, run the non-slow tests (the 15 slowest are listed: CI's budget).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if [ "$(id -u)" = 0 ]; then
  bash scripts/slurm_local.sh start || echo "[test] local SLURM cluster did not start: slurm tests will skip"
fi
.venv/bin/python -m ruff check atlas hydra_plugins tests
.venv/bin/python -m pytest -q --durations=15 "$@"
