source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
NEWP=$PYTHONPATH; OLDP=/tmp/site:/tmp/old/python:$PWD/tests
OV="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128"
for r in "new qwen3-30b-a3b" "old qwen3-30b-a3b" "new deepseek-v2-lite" "old deepseek-v2-lite"; do
  set -- $r
  if [ $1 = old ]; then export PYTHONPATH=$OLDP; else export PYTHONPATH=$NEWP; fi
  echo "== $r"; timeout 80 $OV --model-path benchmarks/configs/$2 --output $OUT/ov_$1_$2.json 2>&1 | grep "overlap bs"
done
export PYTHONPATH=$NEWP
RADIXLM_TEST_TOKENIZER=$PWD/.devrun/tok RADIXLM_TEST_TOKENIZER_DIR=$PWD/.devrun/tok timeout 200 python -m pytest -q -m gpu tests/test_moe.py tests/test_moe_fp8.py tests/test_gpu_moe_mla.py -x -p no:cacheprovider 2>&1 | tail -3
