source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
O="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | grep -v "profiler\|_warn_once" | tail -${TAILN:-1}; }
for i in 1 2; do
  PYTHONPATH=$NEWPP run q06_new$i $O --model-path benchmarks/configs/qwen3-0.6b --input-len 512 --steps 256
  PYTHONPATH=$OLDPP run q06_old$i $O --model-path benchmarks/configs/qwen3-0.6b --input-len 512 --steps 256
done
for m in llama-3.2-1b llama-3.1-8b; do
  PYTHONPATH=$NEWPP run ${m}_new $O --model-path benchmarks/configs/$m --input-len 1024 --steps 128
  PYTHONPATH=$OLDPP run ${m}_old $O --model-path benchmarks/configs/$m --input-len 1024 --steps 128
done
echo "=== tests"
RADIXLM_TEST_TOKENIZER_DIR=$TOK RADIXLM_TEST_TOKENIZER=$TOK timeout $((585 - SECONDS)) python -m pytest -q -m gpu tests/test_gemv.py tests/test_pdl.py 2>&1 | tail -3
