source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
NEWP=$PYTHONPATH; OLDP=/tmp/site:/tmp/old/python:$PWD/tests
echo "== gpu tests"
timeout 150 python -m pytest -q -m gpu tests/test_quantization.py -k "4_bit or gpu_kernels or one_row" -x -p no:cacheprovider 2>&1 | tail -4
echo "== gemv"
timeout 120 python -m radixlm.bench.quant --parts gemv --gemv-ms 1 --output $OUT/gemv.json 2>&1 | grep -E "w4|bf16|copy" 
OV="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64"
for r in "new w4a16" "old w4a16" "new w4a16" "old w4a16" "new none"; do
  set -- $r
  if [ $1 = old ]; then export PYTHONPATH=$OLDP; else export PYTHONPATH=$NEWP; fi
  Q=""; [ $2 != none ] && Q="--quantization $2"
  echo "== $r"; timeout 120 $OV $Q --output $OUT/ov_$1_$2_$RANDOM.json 2>&1 | grep "overlap bs"
done
