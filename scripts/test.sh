#!/usr/bin/env bash
# Set everything up, then run the test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Tests spread over one pytest-xdist worker per core, at most 4 (most of a test is one Python
# thread, or waiting for a server or rank it started); `-n 0` runs them in this process.
WORKERS=$(.venv/bin/python tests/cores.py)
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist loadgroup "$@"
