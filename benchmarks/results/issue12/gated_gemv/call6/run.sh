source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
O="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/llama-3.1-8b --input-len 1024 --steps 128"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | grep -v "profiler\|_warn_once" | tail -${TAILN:-1}; }
PYTHONPATH=$NEWPP run fp8_new1 $O --quantization fp8
PYTHONPATH=$OLDPP run fp8_old1 $O --quantization fp8
PYTHONPATH=$NEWPP run bf16_new $O
PYTHONPATH=$NEWPP run fp8_new2 $O --quantization fp8
PYTHONPATH=$NEWPP run w4_new $O --quantization w4a16
echo "=== tests"
RADIXLM_TEST_TOKENIZER_DIR=$TOK RADIXLM_TEST_TOKENIZER=$TOK timeout $((290 - SECONDS)) python -m pytest -q -m gpu tests/test_gemv.py tests/test_quantization.py 2>&1 | tail -3
