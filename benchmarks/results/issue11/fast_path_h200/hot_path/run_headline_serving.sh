source .devrun/env.sh > /dev/null
mkdir -p $OUT/h
T=$PWD/.devrun/tok
OLD=$PWD/.devrun/old/python:$PYTHONPATH
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
timeout 100 python3 $H --output $OUT/h/headline_new.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
PYTHONPATH=$OLD timeout 100 python3 $H --output $OUT/h/headline_old.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
serve() {
  python3 -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \
      --dtype bfloat16 --tokenizer-path $T --port 30000 > $OUT/h/serve_$1.log 2>&1 &
  for i in $(seq 90); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; sleep 1; done
  timeout 60 python3 -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer $T --num-prompts 100 \
      --max-input-len 1024 --max-output-len 256 --backend radixlm --request-rate 16 --output $OUT/h/serving_$1.json 2>&1 | tail -3
  pkill -TERM -f "radixlm.cli serve" ; sleep 4; pkill -KILL -f "radixlm.cli serve"; sleep 1
}
serve new
PYTHONPATH=$OLD serve old
