#!/usr/bin/env bash
# One command from a fresh clone to a working course environment:
#   ./setup.sh            create .venv, install coursekit (+ test and torchft extras), then run the main job (coursekit demo)
#   ./setup.sh --no-demo  install only
# CPU machines (no nvidia-smi that sees a GPU) get the CPU build of torch through constraints-cpu.txt; GPU
# machines keep pip's default (CUDA) torch. Re-running is cheap: pip sees everything is installed.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${COURSEKIT_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pipargs=(-q)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: no NVIDIA GPU found, pinning the CPU build of torch (constraints-cpu.txt)"
  pipargs+=(-c constraints-cpu.txt)
fi
stamp="$VENV/.coursekit-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ] || [ setup.sh -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install "${pipargs[@]}" -e ".[test,ft]"  # ft: tests/test_torchft.py (slow tier) runs, not skips
  touch "$stamp"
fi
if [ "${1:-}" != "--no-demo" ]; then
  exec "$VENV/bin/coursekit" demo
fi
