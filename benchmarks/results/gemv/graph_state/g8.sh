source .devrun/env.sh >/dev/null
python .devrun/probe.py benchmarks/configs/qwen3-0.6b off 2>&1 | grep -v "^\[\|Warn\|warn"
python .devrun/probe.py benchmarks/configs/qwen3-0.6b on 2>&1 | grep -v "^\[\|Warn\|warn"
