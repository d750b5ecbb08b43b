#!/bin/bash
# Issue 18 host-path changes, hot-path check: headline new / old and the native serving
# benchmark new / old (old = .devrun/old/python = 38c9a09), one H200.
source .devrun/env.sh
T=$PWD/.devrun/tok
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
timeout 140 python3 $H --output $OUT/headline_new.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
PYTHONPATH=$PWD/.devrun/old/python:$PYTHONPATH timeout 140 python3 $H --output $OUT/headline_old.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -3
serve() {
  python3 -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \
      --dtype bfloat16 --tokenizer-path $T --port 30000 > $OUT/serve_$1.log 2>&1 &
  for i in $(seq 120); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; sleep 1; done
  timeout 90 python3 -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer $T --num-prompts 200 \
      --max-input-len 1024 --max-output-len 256 --backend radixlm --request-rate 16 --output $OUT/serving_$1.json 2>&1 | tail -4
  pkill -TERM -f "radixlm.cli serve" ; sleep 5; pkill -KILL -f "radixlm.cli serve"; sleep 1
}
serve new
PYTHONPATH=$PWD/.devrun/old/python:$PYTHONPATH serve old
