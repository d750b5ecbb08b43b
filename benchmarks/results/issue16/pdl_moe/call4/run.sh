source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
O="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | grep -v "profiler\|_warn_once" | tail -${TAILN:-1}; }
for i in 1 2; do
  for m in qwen3-30b-a3b deepseek-v2-lite; do
    PYTHONPATH=$NEWPP run ov_${m}_new$i $O --model-path benchmarks/configs/$m
    PYTHONPATH=$OLDPP run ov_${m}_old$i $O --model-path benchmarks/configs/$m
  done
done
for q in none fp8 w4a16; do
  extra=""; [ $q != none ] && extra="--quantization $q"
  PYTHONPATH=$NEWPP run ov_8b_${q} $O --model-path benchmarks/configs/llama-3.1-8b $extra
done
echo "=== tests"
RADIXLM_TEST_TOKENIZER_DIR=$TOK RADIXLM_TEST_TOKENIZER=$TOK timeout $((585 - SECONDS)) python -m pytest -q -m gpu tests/test_pdl.py tests/test_gpu_moe_mla.py 2>&1 | tail -3
