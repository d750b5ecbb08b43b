source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok --log-level warning"
for i in 1 2 3 4; do
  timeout 200 python3 -m radixlm.bench.startup --runs 1 --output $OUT/startup_final_$i.json --server-args $SA 2>&1 | grep "run 1"
done
timeout 200 python3 .devrun/smoke_serve.py $SA 2>&1 | grep -v Warn | tail -7
