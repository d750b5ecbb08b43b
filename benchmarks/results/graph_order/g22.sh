source .devrun/env.sh >/dev/null
f() { python .devrun/probe12.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
f runner benchmarks/configs/qwen3-0.6b; f toy_timed; f toy
