source .devrun/env.sh >/dev/null
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
python .devrun/pergraph.py $C/qwen3-0.6b 64 ascending per_graph_logits 2>&1 | flt | tail -2
python .devrun/pergraph.py $C/qwen3-0.6b 64 ascending shared 2>&1 | flt | tail -2
python .devrun/pergraph.py $C/llama-3.1-8b 256 ascending per_graph_logits 2>&1 | flt | tail -2
