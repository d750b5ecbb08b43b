source .devrun/env.sh >/dev/null
for m in qwen3-0.6b llama-3.2-1b; do
python .devrun/probe5.py benchmarks/configs/$m on 64 2>&1 | grep -v "^\[\|Warn\|warn"
done
