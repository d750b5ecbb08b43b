set -x
source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
NEW=$PWD/python; OLD=$PWD/.devrun/old/python
timeout 150 python -m pytest -q -m gpu tests/test_triton_attention.py tests/test_mla_attention.py tests/test_fp8_kv_cache.py -x 2>&1 | tail -5 | tee $OUT/pytest_gpu.txt
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/$tag.json 2>&1 | grep -v Warning | tail -16; }
Q="--model-path benchmarks/configs/qwen3-0.6b --batch-size 64 --input-len 512"
E="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64"
PYTHONPATH=$NEW:$PYTHONPATH ov q_new $Q --kernel-table 10
PYTHONPATH=$OLD:$PYTHONPATH ov q_old $Q --kernel-table 10
PYTHONPATH=$NEW:$PYTHONPATH ov e_new $E
PYTHONPATH=$OLD:$PYTHONPATH ov e_old $E
PYTHONPATH=$NEW:$PYTHONPATH ov q_new2 $Q
PYTHONPATH=$NEW:$PYTHONPATH ov e8_new $E --quantization fp8
PYTHONPATH=$OLD:$PYTHONPATH ov e8_old $E --quantization fp8
left=$((560 - SECONDS)); echo "left $left"
[ $left -gt 60 ] && timeout $left python .devrun/skinny.py $OUT/skinny.json $((left - 40))
