#!/bin/bash
# FP8 experts, second GPU call (one H200): tune the grouped GEMM's tiles for FP8 experts
# (128x128 block scales) on the Qwen3-30B-A3B and DeepSeek-V2-Lite expert shapes, then the
# per-layer kernel benchmark again with them.
source .devrun/env.sh
timeout 420 python3 -m radixlm.bench.moe_tune --fp8 --shapes qwen3-30b-a3b,deepseek-v2-lite \
    --batch-sizes 1,16,64,256 2>&1 | grep "^tune\|wrote\|Error\|Traceback" | tee $OUT/tune_fp8.txt
mkdir -p $OUT/configs && cp python/radixlm/layers/moe/configs/nvidia_h200/*_fp8w.json $OUT/configs/
timeout 120 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 1,64,256 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite --output $OUT/moe_kernel_fp8_tuned.json 2>&1 \
    | grep "^moe\|Error\|Traceback" | tail -12
