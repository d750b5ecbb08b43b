#!/bin/bash
# Final code (one H200): GPU tests, the per-layer kernel benchmark (all paths), and whole MoE
# models bf16 vs FP8 (prefill 1 x 1024 and 64 x 1024, decode at batch 1 and 64).
source .devrun/env.sh
timeout 200 python3 -m pytest -q -m gpu tests/test_moe_fp8.py tests/test_moe.py 2>&1 | tail -2 \
    | tee $OUT/tests_moe_gpu_final.txt
timeout 120 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 1,4,64,1024,4096 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --output $OUT/moe_kernel_final.json 2>&1 \
    | grep "^moe.*fp8 graphed\|Error\|Traceback" | tail -15
for m in qwen3-30b-a3b deepseek-v2-lite; do
  timeout 150 python3 -m radixlm.bench.quant --parts model --quants fp8 \
      --model-path benchmarks/configs/$m --batch-sizes 1,64 --input-len 1024 --output-len 16 \
      --output $OUT/model_final_$m.json 2>&1 | grep -i "bs \|Error\|Traceback" | tail -6
done
