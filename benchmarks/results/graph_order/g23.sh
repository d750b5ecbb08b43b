source .devrun/env.sh >/dev/null
f() { python .devrun/probe13.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
Q=benchmarks/configs/qwen3-0.6b
f $Q descending 64 off; f $Q ascending 64 off; f $Q descending 8 off; f $Q descending 2 off; f $Q descending 1 off
f $Q descending 64 on; f $Q ascending 64 on
