source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok --log-level warning"
i=0
for v in new new prev new prev new; do
  i=$((i+1))
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.prev/python; else PP=/tmp/site:$PWD/python; fi
  PYTHONPATH=$PP timeout 200 python3 -m radixlm.bench.startup --runs 1 --output $OUT/startup_${i}_${v}.json --server-args $SA 2>&1 | grep "run 1" | sed "s/^/$v: /"
done
timeout 200 python3 .devrun/smoke_serve.py $SA 2>&1 | grep -v Warn | tail -8
