source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 150 python -m pytest -q -m gpu tests/test_quantization.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/pytest_gpu.txt
timeout 100 python -m radixlm.bench.quant --parts gemv --gemv-ms 1 --output $OUT/gemv_final.json 2>&1 | grep "w4\|fp8_new"
M=benchmarks/configs/llama-3.1-8b
for q in w4a16 fp8; do
timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 --quantization $q --output $OUT/overlap_${q}_bs1.json 2>&1 | grep "overlap bs" | sed "s/^/$q: /"
done
