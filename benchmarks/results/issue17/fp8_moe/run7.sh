#!/bin/bash
# Tiles for the W8A8 grouped GEMMs at prefill-sized batches (one H200).
source .devrun/env.sh
timeout 300 python3 -m radixlm.bench.moe --parts w8a8-sweep --batch-sizes 1024,4096 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --output $OUT/w8a8_sweep.json 2>&1 \
    | grep "^w8a8\|Error\|Traceback" | tail -14
