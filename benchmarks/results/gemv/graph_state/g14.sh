source .devrun/env.sh >/dev/null
for m in qwen3-0.6b llama-3.2-1b; do for v in on off; do
python .devrun/probe4.py benchmarks/configs/$m $v 64 2>&1 | grep -v "^\[\|Warn\|warn"
done; done
