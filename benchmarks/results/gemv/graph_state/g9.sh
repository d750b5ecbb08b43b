source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
python .devrun/probe2.py $M 2,1024,1024,2048 8,1024,4096,1024 2>&1 | grep -v "^\[\|Warn\|warn"
python .devrun/probe2.py $M 8,1024,4096,1024 2>&1 | grep -v "^\[\|Warn\|warn"
python .devrun/probe2.py $M 4,512,4096,1024 8,512,4096,1024 2>&1 | grep -v "^\[\|Warn\|warn"
