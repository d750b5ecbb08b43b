source .devrun/env.sh >/dev/null
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
python .devrun/pergraph.py $C/llama-3.1-8b 256 ascending 2>&1 | flt | tail -3
python .devrun/pergraph.py $C/qwen3-0.6b 64 ascending 2>&1 | flt | tail -3
python .devrun/pergraph.py $C/llama-3.2-1b 64 ascending 2>&1 | flt | tail -3
python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --output /tmp/o.json 2>&1 | flt | tail -1
