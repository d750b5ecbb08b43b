source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
M=benchmarks/configs/llama-3.1-8b
for v in none fp8 w4; do
  QF=""
  [ $v = fp8 ] && QF="--quantization fp8"
  [ $v = w4 ] && QF="--quantization w4a16"
  echo "== $v"
  timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 $QF --kernel-table 18 --output $OUT/overlap_${v}.json 2>&1 | grep -A19 "GPU time a step" | tail -20
done
