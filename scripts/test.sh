#!/usr/bin/env bash
# The test command (README, CI): set up if needed, then the whole suite on CPU/gloo.
#   scripts/test.sh            default tier (CI)
#   scripts/test.sh --slow     also the slow tier (op builds, NVMe offload)
#   scripts/test.sh -k launch  any other pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh --no-demo
export COURSEKIT_DEVICE=${COURSEKIT_DEVICE:-cpu} OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
args=()
if [ "${1:-}" = "--slow" ]; then shift; else args+=(-m "not slow"); fi
exec .venv/bin/python -m pytest "${args[@]}" "$@"
