#!/usr/bin/env bash
# One command from a fresh clone to a working course environment:
#   ./setup.sh            create .venv, install coursekit (+ test and torchft extras), then run the main job (coursekit demo)
#   ./setup.sh --no-demo  install only
#   ./setup.sh --instructor  install, then the grading sandbox (bubblewrap: apt as root, else the command to run)
#                            and `coursekit doctor`, which says whether grading works here
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
if [ "${1:-}" = "--instructor" ]; then
  if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing bubblewrap (the grading sandbox)"
      { apt-get install -y -qq --no-install-recommends bubblewrap || { apt-get update -qq &&
        apt-get install -y -qq --no-install-recommends bubblewrap; }; } >/dev/null
    else
      echo "setup: grading runs each submission in a bubblewrap sandbox, which is not installed: run" >&2
      echo "         sudo apt-get install bubblewrap     (Debian/Ubuntu; dnf/zypper: bubblewrap)" >&2
      echo "       then ./setup.sh --instructor again" >&2
      exit 1
    fi
  fi
  exec "$VENV/bin/coursekit" doctor
fi
if [ "${1:-}" != "--no-demo" ]; then
  exec "$VENV/bin/coursekit" demo
fi
