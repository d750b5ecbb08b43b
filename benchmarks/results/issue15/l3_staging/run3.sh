#!/bin/bash
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
for code in new old; do
  if [ $code = old ]; then export PYTHONPATH=/tmp/site:$PWD/.old/python; else export PYTHONPATH=/tmp/site:$PWD/python; fi
  timeout 200 python3 $S --server-args "$SA" --tokens 8000 --drop-page-cache --output $OUT/${code}_dropped.json 2>&1 | grep "^L3\|Error\|error" | tail -3
done
