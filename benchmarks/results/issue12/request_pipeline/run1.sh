#!/bin/bash
# Issue 12, request path: prompts sent to the scheduler as they pass their checks, orjson
# parsing. Headline, new (working tree) and old (.old/python = 15d7474) alternating, one H200.
source .devrun/env.sh
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
for i in 1 2; do
  timeout 140 python3 $H --output $OUT/headline_new_$i.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
  PYTHONPATH=$PWD/.old/python:$PYTHONPATH timeout 140 python3 $H --output $OUT/headline_old_$i.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
done
