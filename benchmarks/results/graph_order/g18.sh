source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
f() { python .devrun/probe8.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
f mixed; f mixed_many; f mixed_mem 16
f model $M 65536 64; f model $M 4096 64; f model $M 65536 8; f model $M 65536 2
