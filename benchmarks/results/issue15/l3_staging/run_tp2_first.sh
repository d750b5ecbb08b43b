#!/bin/bash
# Issue 15: the file tier (staging arena) under TP2 on 2 GPUs: L3 hit vs recompute, 8k tokens.
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok --tp-size 2"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
timeout 280 python3 $S --server-args "$SA" --tokens 8000 --output $OUT/tp2_hot.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
timeout 200 python3 $S --server-args "$SA" --tokens 8000 --drop-page-cache --output $OUT/tp2_dropped.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
