source .devrun/env.sh >/dev/null
python .devrun/probe3.py benchmarks/configs/qwen3-0.6b free 2>&1 | grep -v "^\[\|Warn\|warn"
python .devrun/probe3.py benchmarks/configs/llama-3.2-1b free 2>&1 | grep -v "^\[\|Warn\|warn"
