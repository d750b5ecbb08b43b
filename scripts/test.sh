#!/usr/bin/env bash
# Set everything up, then run the test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Test files spread over one pytest-xdist worker per core, at most 4 (most of a test is one
# Python thread, or waiting for a server or rank it started); a file's tests stay on one worker,
# in order, sharing its module-scoped servers. With a GPU, one process: the GPU tests' engines
# must not compete for its memory. `-n 0` runs them in this process anyway.
WORKERS=$(.venv/bin/python tests/cores.py)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then WORKERS=0; fi
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist loadfile "$@"
