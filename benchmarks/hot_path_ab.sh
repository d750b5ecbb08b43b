# The hot-path check a change to the scheduler, model runner, kernels or sampling owes before its
# issue closes: the same figures for an old and a new tree, in one device call, alternated.
#
#   bash benchmarks/hot_path_ab.sh OLD_PYTHONPATH NEW_PYTHONPATH OUT_DIR
#
# Qwen3-0.6B bs 64 (greedy twice, temperature 0.7, top-p 0.9) and Llama-3.2-1B bs 1 (twice) with
# `bench overlap`, then `bench serving` against a Llama-3.2-1B server (OpenAI and native
# backends, 16 req/s), all on dummy weights. The serving check needs a tokenizer in .devrun/tok.
# Earlier checks (results/*/ab_run.sh) each carried a copy of these lines.
set -u
OLDPP=$1; NEWPP=$2; OUTD=$3
Q="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/qwen3-0.6b --batch-size 64 --input-len 512"
L="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.2-1b --batch-size 1 --input-len 1024 --steps 128"
tree() { if [ "$1" = old ]; then echo "$OLDPP"; else echo "$NEWPP"; fi; }
for r in 1 2; do
  for v in old new; do
    echo "== overlap qwen3 bs64 greedy $v $r"
    PYTHONPATH=$(tree $v) timeout 100 python -m radixlm.bench.overlap $Q \
      --output $OUTD/qwen3_bs64_${v}_$r.json 2>&1 | grep -i "tok/s" | tail -1
  done
done
for s in "--temperature 0.7" "--temperature 0.7 --top-p 0.9"; do
  for v in old new; do
    echo "== overlap qwen3 bs64 $s $v"
    PYTHONPATH=$(tree $v) timeout 100 python -m radixlm.bench.overlap $Q $s 2>&1 \
      | grep -i "tok/s" | tail -1
  done
done
for v in old new old new; do
  echo "== overlap llama1b bs1 $v"
  PYTHONPATH=$(tree $v) timeout 100 python -m radixlm.bench.overlap $L 2>&1 | grep -i "tok/s" | tail -1
done
echo "elapsed $SECONDS"
serve_bench() {
  local v=$1 pid
  PYTHONPATH=$(tree $v) python -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b \
    --load-format dummy --dtype bfloat16 --tokenizer-path .devrun/tok --port 30000 \
    --log-level warning > $OUTD/serve_$v.log 2>&1 &
  pid=$!
  for i in $(seq 1 180); do curl -s localhost:30000/health > /dev/null && break; sleep 1; done
  for be in openai radixlm; do
    echo "== serving $v $be"
    PYTHONPATH=$(tree $v) timeout 100 python -m radixlm.bench.serving \
      --base-url http://127.0.0.1:30000 --tokenizer .devrun/tok --num-prompts 200 \
      --max-input-len 1024 --max-output-len 256 --backend $be --request-rate 16 \
      --output $OUTD/serving_${v}_$be.json 2>&1 | grep -v -i warn \
      | grep -i -E "ttft|tpot|req/s|throughput" | head -6
  done
  kill -TERM $pid; wait $pid
}
serve_bench old
serve_bench new
echo "elapsed $SECONDS"
