#!/bin/bash
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
timeout 240 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -3
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
python3 $S --server-args "$SA" --tokens 8000 --output $OUT/l3_8b_hot.json 2>&1 | grep "^L3\|Error\|error" | tail -3
python3 $S --server-args "$SA" --tokens 8000 --drop-page-cache --output $OUT/l3_8b_dropped.json 2>&1 | grep "^L3\|Error\|error" | tail -3
