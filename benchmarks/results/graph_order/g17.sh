source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
f() { python .devrun/probe7.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
f micro 350; f micro 50; f micro 1000; f micro_first 350
f first $M; f upload $M; f recapture_all $M
