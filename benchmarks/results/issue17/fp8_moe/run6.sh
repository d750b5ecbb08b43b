#!/bin/bash
# Why FP8 prefill is not faster: profile one prefill of each model, bf16 then FP8 (one H200).
source .devrun/env.sh
for m in deepseek-v2-lite qwen3-30b-a3b; do
  timeout 200 python3 benchmarks/results/issue17/fp8_moe/prefill_profile.py benchmarks/configs/$m \
      2>&1 | grep -E "^===|^(bf16|fp8):|^ +[0-9.]+ ms|Error|Traceback" | tail -26
done
