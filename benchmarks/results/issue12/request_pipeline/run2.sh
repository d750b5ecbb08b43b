#!/bin/bash
# Issue 12, request path, final code (also skips the second type scan of a batch's id lists):
# GPU hicache tests (the file tier's review fixes), headline new / old / new, and the native
# serving benchmark new vs old (old = .old/python = 15d7474), one H200.
source .devrun/env.sh
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -1
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
timeout 140 python3 $H --output $OUT/headline_final_new_1.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
PYTHONPATH=$PWD/.old/python:$PYTHONPATH timeout 140 python3 $H --output $OUT/headline_final_old_1.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
timeout 140 python3 $H --output $OUT/headline_final_new_2.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
serve() {   # $1: label; PYTHONPATH chosen by the caller
  python3 -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \
      --dtype bfloat16 --tokenizer-path $PWD/.tok --port 30000 > $OUT/serve_$1.log 2>&1 &
  for i in $(seq 120); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; sleep 1; done
  timeout 90 python3 -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer .tok --num-prompts 200 \
      --max-input-len 1024 --max-output-len 256 --backend radixlm --request-rate 16 --output $OUT/serving_$1.json 2>&1 | tail -4
  pkill -TERM -f "radixlm.cli serve" ; sleep 5; pkill -KILL -f "radixlm.cli serve"; sleep 1
}
serve new
PYTHONPATH=$PWD/.old/python:$PYTHONPATH serve old
