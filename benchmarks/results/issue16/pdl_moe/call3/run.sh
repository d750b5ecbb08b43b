source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
M="python -m radixlm.bench.moe --parts model --batch-sizes 1 --input-len 1024 --output-len 64"
O="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | grep -v "profiler\|_warn_once" | tail -${TAILN:-2}; }
for m in qwen3-30b-a3b deepseek-v2-lite; do
  PYTHONPATH=$NEWPP run moe_${m}_new $M --model-path benchmarks/configs/$m
  PYTHONPATH=$OLDPP run moe_${m}_old $M --model-path benchmarks/configs/$m
  PYTHONPATH=$NEWPP run moe_${m}_new2 $M --model-path benchmarks/configs/$m
done
PYTHONPATH=$NEWPP run ov_q30_new $O --model-path benchmarks/configs/qwen3-30b-a3b
PYTHONPATH=$OLDPP run ov_q30_old $O --model-path benchmarks/configs/qwen3-30b-a3b
echo "=== tests"
RADIXLM_TEST_TOKENIZER=$TOK timeout $((585 - SECONDS)) python -m pytest -q -m gpu tests/test_pdl.py tests/test_gemv.py tests/test_moe.py tests/test_moe_fp8.py tests/test_gpu_moe_mla.py 2>&1 | tail -3
