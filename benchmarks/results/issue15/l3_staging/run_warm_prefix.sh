#!/bin/bash
# Issue 15: L3 hit vs recompute with the restarted server's prefix-extend path warmed too; TP2 and TP1.
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
timeout 200 python3 $S --server-args "$SA --tp-size 2" --tokens 8000 --warm-prefix-path --output $OUT/tp2_hot_warm.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
timeout 200 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/tp1_hot_warm.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
