source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 200 python -m pytest -q -m gpu tests/test_quantization.py tests/test_moe_fp8.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/pytest_gpu.txt
M=benchmarks/configs/llama-3.1-8b
for round in 1 2; do
for v in none fp8 fp8old; do
  QF=""; OLD=0
  [ $v = fp8 ] && QF="--quantization fp8"
  [ $v = fp8old ] && QF="--quantization fp8" && OLD=1
  RADIXLM_DISABLE_QUANT_GEMV=$OLD timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 $QF --output $OUT/overlap_${v}_r$round.json 2>&1 | grep "overlap bs" | sed "s/^/$v r$round: /"
done
done
timeout 150 python -m radixlm.bench.quant --parts gemv --gemv-ms 1 --output $OUT/gemv_final.json 2>&1 | grep "M=1"
