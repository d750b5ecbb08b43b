#!/usr/bin/env bash
# Set everything up, then run the test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest -q "$@"
