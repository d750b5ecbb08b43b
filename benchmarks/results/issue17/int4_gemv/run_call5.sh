source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 120 python -m pytest -q -m gpu tests/test_quantization.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/pytest_gpu.txt
timeout 240 python -m radixlm.bench.quant --parts gemv-sweep --gemv-ms 1 --output $OUT/gemv_sweep_w4b.json 2>&1 | grep -v "^  .*: " > $OUT/sweep.txt
grep "M=1" $OUT/sweep.txt | grep -v fp8; grep "sweep .* w4" $OUT/sweep.txt
M=benchmarks/configs/llama-3.1-8b
for v in w4 w4old; do
  QF="--quantization w4a16"; OLD=0
  [ $v = w4old ] && OLD=1
  RADIXLM_DISABLE_QUANT_GEMV=$OLD timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 $QF --output $OUT/overlap_${v}.json 2>&1 | grep "overlap bs" | sed "s/^/$v: /"
done
