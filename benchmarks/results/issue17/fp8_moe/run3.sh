#!/bin/bash
# Per-pair GEMVs for decode-sized MoE steps (one H200): GPU tests (both kernel paths, bf16 and
# FP8), the GEMV tile sweep at batch 1, then the per-layer kernel benchmark with both paths
# forced up to batch 16.
source .devrun/env.sh
timeout 240 python3 -m pytest -q -m gpu tests/test_moe_fp8.py tests/test_moe.py 2>&1 | tail -3 \
    | tee $OUT/tests_moe_gpu_gemv.txt
timeout 200 python3 -m radixlm.bench.moe --parts gemv-sweep --shapes qwen3-30b-a3b,deepseek-v2-lite \
    --output $OUT/gemv_sweep.json 2>&1 | grep "^gemv\|Error\|Traceback" | tail -10
timeout 150 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 1,4,16,64,256 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --output $OUT/moe_kernel_paths.json 2>&1 \
    | grep "^moe\|Error\|Traceback" | tail -40
