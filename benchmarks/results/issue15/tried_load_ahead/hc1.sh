#!/bin/bash
# issue 15: loads ahead of admission vs loads in the match, same machine
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
W="--num-users 32 --num-turns 6 --system-prompt-len 2048 --question-len 64 --output-len 32 --num-docs 16 --doc-len 4096 --questions-per-doc 4"
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -4
python3 -m radixlm.bench.hicache --part multi-turn,long-doc --server-args "$SA" --max-total-tokens 32768 --hicache-ratio 4 $W --output $OUT/ahead.json 2>&1 | grep "hicache " 
RADIXLM_HICACHE_LOAD_IN_MATCH=1 python3 -m radixlm.bench.hicache --part multi-turn,long-doc --server-args "$SA" --max-total-tokens 32768 --hicache-ratio 4 $W --output $OUT/in_match.json 2>&1 | grep "hicache "
