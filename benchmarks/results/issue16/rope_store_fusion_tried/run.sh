source .devrun/env.sh > /dev/null
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== gpu tests"
timeout 200 python -m pytest -q -m gpu tests/test_fused_ops.py tests/test_gpu_moe_mla.py tests/test_pdl.py -p no:cacheprovider -o addopts="" 2>&1 | tail -4
M="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/qwen3-30b-a3b --batch-size 1 --input-len 1024 --steps 128"
for r in 1 2; do
  for v in new old; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    echo "== overlap qwen3-30b-a3b bs1 $v $r"
    PYTHONPATH=$PP timeout 120 python -m radixlm.bench.overlap $M --output $OUT/a3b_bs1_${v}_$r.json 2>&1 | grep -i -E "tok/s|roofline" | tail -3
  done
done
