#!/bin/bash
# Whole MoE models, bf16 vs FP8 experts (online --quantization fp8), random weights, model
# runner with CUDA graphs (one H200); then the per-layer paths once more with the final tiles.
source .devrun/env.sh
for m in qwen3-30b-a3b deepseek-v2-lite; do
  timeout 260 python3 -m radixlm.bench.quant --parts model --quants fp8 \
      --model-path benchmarks/configs/$m --batch-sizes 1,64 --input-len 1024 --output-len 16 \
      --output $OUT/model_$m.json 2>&1 | grep -i "bs \|Error\|Traceback" | tail -8
done
timeout 90 python3 -m radixlm.bench.moe --parts kernel --fp8 --batch-sizes 1,4 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --output $OUT/moe_kernel_final.json 2>&1 \
    | grep "^moe\|Error\|Traceback" | tail -24
