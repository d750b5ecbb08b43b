source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
B="python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --tokenizer-path $TOK --tp-sizes 1 2 --batch-sizes 1 --output-len 256"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | tail -${TAILN:-6}; }
PYTHONPATH=$NEWPP run new1 $B --no-profile
PYTHONPATH=$OLDPP run old1 $B --no-profile
PYTHONPATH=$NEWPP XEXP_GEMV_WIDE=4 run wide4 $B --no-profile

PYTHONPATH=$NEWPP XEXP_GEMV_WIDE=8 run wide8 $B --no-profile
PYTHONPATH=$NEWPP run new2 $B --no-profile
PYTHONPATH=$OLDPP run old2 $B --no-profile

echo "=== test"
RADIXLM_TEST_TOKENIZER=$TOK timeout $((570 - SECONDS)) python -m pytest -q -x tests/test_gpu_tensor_parallel.py 2>&1 | tail -3
