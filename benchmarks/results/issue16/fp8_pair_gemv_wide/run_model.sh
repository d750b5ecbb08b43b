source .devrun/env.sh > /dev/null
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
for i in 1 2; do
for m in qwen3-30b-a3b deepseek-v2-lite; do
for v in new old; do
 if [ $v = old ]; then PP=$OLDPP; else PP=$PYTHONPATH; fi
 echo "== $v $m fp8 bs1"
 PYTHONPATH=$PP timeout 150 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/$m --input-len 1024 --steps 128 --quantization fp8 --output $OUT/ov_${m}_fp8_${v}_$i.json 2>&1 | grep "^overlap bs\|Error"
done; done; done
timeout 330 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_moe_fp8.py tests/test_moe.py tests/test_mla_decode_kernels.py tests/test_gpu_moe_mla.py -k "not mixtral and not qwen2" 2>&1 | tail -4
