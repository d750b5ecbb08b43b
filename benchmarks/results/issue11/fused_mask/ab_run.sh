# Fifth call (the fourth found a fresh machine: no wheels, no old tree): the hot-path check: old = 53ec940's python/ (.devrun/old.tgz), new =
# this change; Qwen3-0.6B bs 64 greedy and sampled (temperature 0.7; and with top-p 0.9), Llama-3.2-1B
# bs 1, serving 1B; then `bench structured` new and old once more.
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc
# (a fresh machine: the wheels and the old tree again)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -1
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
Q="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/qwen3-0.6b --batch-size 64 --input-len 512"
L="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.2-1b --batch-size 1 --input-len 1024 --steps 128"
for r in 1 2; do
  for v in old new; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    echo "== overlap qwen3 bs64 $v $r"
    PYTHONPATH=$PP timeout 100 python -m radixlm.bench.overlap $Q --output $OUT/qwen3_bs64_${v}_$r.json 2>&1 | grep -i -E "tok/s" | tail -1
  done
done
for s in "--temperature 0.7" "--temperature 0.7 --top-p 0.9"; do
  for v in old new; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    echo "== overlap qwen3 bs64 $s $v"
    PYTHONPATH=$PP timeout 100 python -m radixlm.bench.overlap $Q $s 2>&1 | grep -i -E "tok/s" | tail -1
  done
done
for v in old new old new; do
  if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
  echo "== overlap llama1b bs1 $v"
  PYTHONPATH=$PP timeout 100 python -m radixlm.bench.overlap $L 2>&1 | grep -i -E "tok/s" | tail -1
done
echo "elapsed $SECONDS"
serve_bench() {
  v=$1; PP=$2
  PYTHONPATH=$PP python -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path .devrun/tok --port 30000 --log-level warning > $OUT/serve_$v.log 2>&1 &
  pid=$!
  for i in $(seq 1 180); do curl -s localhost:30000/health > /dev/null && break; sleep 1; done
  for be in openai radixlm; do
    echo "== serving $v $be"
    PYTHONPATH=$PP timeout 100 python -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer .devrun/tok --num-prompts 200 --max-input-len 1024 --max-output-len 256 --backend $be --request-rate 16 --output $OUT/serving_${v}_$be.json 2>&1 | grep -v -i warn | grep -i -E "ttft|tpot|req/s|throughput" | head -6
  done
  kill -TERM $pid; wait $pid
}
serve_bench old $OLDPP
serve_bench new $NEWPP
echo "elapsed $SECONDS"
