source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/h
T=$PWD/.devrun/tok
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
PYTHONPATH=$NEW timeout 100 python3 $H --output $OUT/h/headline_new.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
PYTHONPATH=$OLD timeout 100 python3 $H --output $OUT/h/headline_old.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
B="-m radixlm.bench.one_batch --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.2-1b --batch-size 256 --input-len 512 --output-len 32"
PYTHONPATH=$NEW timeout 100 python3 $B --output $OUT/h/one_batch_1b_bs256_new.json 2>&1 | grep -v Warn | tail -2
PYTHONPATH=$OLD timeout 100 python3 $B --output $OUT/h/one_batch_1b_bs256_old.json 2>&1 | grep -v Warn | tail -2
serve() {
  python3 -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \
      --dtype bfloat16 --tokenizer-path $T --port 30000 > /tmp/serve_$1.log 2>&1 &
  for i in $(seq 90); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; sleep 1; done
  timeout 60 python3 -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer $T --num-prompts 100 \
      --max-input-len 1024 --max-output-len 256 --backend radixlm --request-rate 16 --output $OUT/h/serving_$1.json 2>&1 | tail -3
  pkill -TERM -f "radixlm.cli serve" ; sleep 4; pkill -KILL -f "radixlm.cli serve"; sleep 1
}
PYTHONPATH=$NEW serve new
PYTHONPATH=$OLD serve old
echo "elapsed $SECONDS"
PYTHONPATH=$OLD timeout 90 python -m pytest -q -m gpu tests/test_fp8_kv_cache.py -k capacity 2>&1 | tail -3
