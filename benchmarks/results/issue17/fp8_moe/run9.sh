#!/bin/bash
# Final code (one H200): the FP8 MoE GPU tests, then one profiled 4 x 1024-token prefill of each
# model, bf16 then FP8 (GPU busy time: steadier than one timed prefill).
source .devrun/env.sh
timeout 100 python3 -m pytest -q -m gpu tests/test_moe_fp8.py 2>&1 | tail -2 \
    | tee $OUT/tests_moe_fp8_gpu_final.txt
for m in deepseek-v2-lite qwen3-30b-a3b; do
  timeout 100 python3 benchmarks/results/issue17/fp8_moe/prefill_profile.py benchmarks/configs/$m \
      2>&1 | grep -E "^===|^(bf16|fp8):|^ +[0-9.]+ ms|Error|Traceback" | head -8
done
