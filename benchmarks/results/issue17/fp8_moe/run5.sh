#!/bin/bash
# FP8 inputs (W8A8) for prefill-sized MoE batches (one H200): GPU tests, the per-layer kernel
# benchmark at large batches (weight-only vs W8A8 forced), then whole models bf16 vs FP8 again.
source .devrun/env.sh
timeout 240 python3 -m pytest -q -m gpu tests/test_moe_fp8.py tests/test_moe.py 2>&1 | tail -3 \
    | tee $OUT/tests_moe_gpu_w8a8.txt
timeout 150 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 64,256,1024,4096 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --output $OUT/moe_kernel_w8a8.json 2>&1 \
    | grep "^moe.*w8a8\|Error\|Traceback" | tail -14
for m in qwen3-30b-a3b deepseek-v2-lite; do
  timeout 200 python3 -m radixlm.bench.quant --parts model --quants fp8 \
      --model-path benchmarks/configs/$m --batch-sizes 1,64 --input-len 1024 --output-len 16 \
      --output $OUT/model_w8a8_$m.json 2>&1 | grep -i "fp8    bs \|Error\|Traceback" | tail -4
done
