#!/bin/bash
# Final code (after the rid fix and the file tier's admission peek): GPU hicache tests and one
# headline run, one H200.
source .devrun/env.sh
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -1
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
timeout 140 python3 $H --output $OUT/headline_after_rid_fix.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
