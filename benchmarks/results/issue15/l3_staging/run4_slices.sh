#!/bin/bash
# Issue 15: staging pieces as memoryview slices: the fetch alone, then L3 hit vs recompute at TP1 and TP2 (prefix path warmed).
source .devrun/env.sh
python3 benchmarks/results/issue15/l3_staging/fetch_device.py --tokens 8192 --device cuda --repeats 3 2>&1 | tail -4
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
timeout 200 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/tp1_hot_warm_slices.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
timeout 200 python3 $S --server-args "$SA --tp-size 2" --tokens 8000 --warm-prefix-path --output $OUT/tp2_hot_warm_slices.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
timeout 200 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --drop-page-cache --output $OUT/tp1_dropped_warm_slices.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
