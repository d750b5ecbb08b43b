source .devrun/env.sh > /dev/null
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH

serve_bench() {
  v=$1; PP=$2
  PYTHONPATH=$PP python -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path .devrun/tok --port 30000 --log-level warning > $OUT/serve_$v.log 2>&1 &
  pid=$!
  for i in $(seq 1 180); do curl -s localhost:30000/health > /dev/null && break; sleep 1; done
  for be in openai radixlm; do
    echo "== serving $v $be"
    PYTHONPATH=$PP timeout 100 python -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer .devrun/tok --num-prompts 200 --max-input-len 1024 --max-output-len 256 --backend $be --request-rate 16 --output $OUT/serving_${v}_$be.json 2>&1 | grep "^serving"
  done
  kill -TERM $pid; wait $pid
}
serve_bench new $NEWPP
serve_bench old $OLDPP
serve_bench new2 $NEWPP
serve_bench old2 $OLDPP
