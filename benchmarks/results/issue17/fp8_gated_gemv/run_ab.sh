source .devrun/env.sh > /dev/null
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
timeout 200 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_quantization.py tests/test_gemv.py -k "gated or one_row or graphs or gemv" 2>&1 | tail -3
for m in llama-3.1-8b deepseek-v2-lite; do
for v in new old; do
 if [ $v = old ]; then PP=$OLDPP; else PP=$PYTHONPATH; fi
 echo "== $v $m fp8 bs1"
 PYTHONPATH=$PP timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/$m --input-len 1024 --steps 128 --quantization fp8 --output $OUT/ov_${m}_fp8_${v}.json 2>&1 | grep "^overlap bs\|Error"
done; done
