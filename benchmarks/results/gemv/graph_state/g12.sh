source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
python .devrun/probe3.py $M recap64 2>&1 | grep -v "^\[\|Warn\|warn"
