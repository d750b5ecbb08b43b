#!/bin/bash
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
for p in 2 1 8 0; do XP_PROGRAMS=$p python3 -m radixlm.bench.hicache --part bandwidth --server-args "$SA" --bandwidth-tokens 16384 --output $OUT/bw_$p.json 2>&1 | grep "bandwidth," | sed "s/^/p=$p /"; done
python3 .devrun/hc2.py "$SA" 2>&1 | grep -v "^INFO\|WARNING"
