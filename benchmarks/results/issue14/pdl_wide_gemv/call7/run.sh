source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
TOK=$PWD/.devrun/tok
T="python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --tokenizer-path $TOK --tp-sizes 1 2 --batch-sizes 1 --output-len 256 --no-profile"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | tail -${TAILN:-4}; }
run tp_final1 $T
run tp_final2 $T
echo "=== test"
RADIXLM_TEST_TOKENIZER=$TOK timeout $((270 - SECONDS)) python -m pytest -q -x tests/test_gpu_tensor_parallel.py 2>&1 | tail -2
