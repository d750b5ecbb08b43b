source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 150 python -m pytest -q -m gpu tests/test_quantization.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/pytest_gpu.txt
timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64 --quantization w4a16 --output $OUT/overlap_w4a16_bs1.json 2>&1 | grep "overlap bs"
