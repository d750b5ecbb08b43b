#!/usr/bin/env bash
# Set everything up, then serve the bundled model on http://127.0.0.1:30000 (extra args go to
# `radixlm serve`, e.g. --port 8000 or --model-path /path/to/model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/radixlm serve "$@"
