#!/bin/bash
# Issue 15, final code: GPU hicache tests, the fetch alone, L3 hit vs recompute at TP1 and TP2.
source .devrun/env.sh
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -2
python3 benchmarks/results/issue15/l3_staging/fetch_device.py --tokens 8192 --device cuda --repeats 3 2>&1 | tail -4
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
timeout 150 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/final_tp1_hot.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
timeout 150 python3 $S --server-args "$SA --tp-size 2" --tokens 8000 --warm-prefix-path --output $OUT/final_tp2_hot.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
