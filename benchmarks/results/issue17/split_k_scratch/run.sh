source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 200 python -m pytest -q -m gpu tests/test_quantization.py tests/test_gemv.py tests/test_moe_fp8.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/pytest_gpu.txt
M=benchmarks/configs/llama-3.1-8b
NEW=$PYTHONPATH
OLD=/tmp/site:$PWD/.devrun/oldsk/python:$PWD/tests
for bs in 16 1; do
for q in fp8 w4a16; do
  [ $bs = 1 ] && [ $q = fp8 ] && continue
  for code in new old; do
    P=$NEW; [ $code = old ] && P=$OLD
    PYTHONPATH=$P timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size $bs --input-len 1024 --steps 64 --quantization $q --output $OUT/overlap_${q}_bs${bs}_${code}.json 2>&1 | grep "overlap bs" | sed "s/^/$q $code: /"
  done
done
done
