source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 120 python -m pytest -q -m gpu tests/test_quantization.py tests/test_gemv.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/pytest_gpu.txt
timeout 150 python -m radixlm.bench.quant --parts gemv --gemv-ms 1 --output $OUT/gemv_final.json 2>&1 | grep "M=1"
M=benchmarks/configs/llama-3.1-8b
for v in none fp8 w4 w4old; do
  QF=""; OLD=0
  [ $v = fp8 ] && QF="--quantization fp8"
  [ $v = w4 ] && QF="--quantization w4a16"
  [ $v = w4old ] && QF="--quantization w4a16" && OLD=1
  RADIXLM_DISABLE_QUANT_GEMV=$OLD timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 $QF --output $OUT/overlap_${v}.json 2>&1 | grep "overlap bs" | sed "s/^/$v: /"
done
