#!/bin/bash
# FP8 experts, first GPU call (one H200): the GPU tests of the kernels and the FP8 MoE models,
# the bf16 MoE kernel tests (the kernel changed), and the per-layer kernel benchmark.
source .devrun/env.sh
timeout 300 python3 -m pytest -q -m gpu tests/test_moe_fp8.py tests/test_moe.py 2>&1 | tail -4 \
    | tee $OUT/tests_moe_gpu.txt
timeout 240 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 1,64,256 \
    --output $OUT/moe_kernel_fp8.json 2>&1 | grep "^moe\|Error\|Traceback" | tail -20
