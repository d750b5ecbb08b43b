source .devrun/env.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
TOK=$PWD/.devrun/tok
NEWPP=$PYTHONPATH
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
T="python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --tokenizer-path $TOK --tp-sizes 1 2 --batch-sizes 1 --output-len 256"
O="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128"
run() { local name=$1; shift; echo "=== $name"; "$@" --output $OUT/$name.json 2>&1 | grep -v "^\s*$" | tail -${TAILN:-4}; }
PYTHONPATH=$NEWPP TAILN=30 run tp_new_prof $T --kernel-table 16
PYTHONPATH=$OLDPP run tp_old $T --no-profile
PYTHONPATH=$NEWPP run tp_new $T --no-profile
for m in llama-3.2-1b llama-3.1-8b; do
  PYTHONPATH=$NEWPP run ov_${m}_new $O --model-path benchmarks/configs/$m
  PYTHONPATH=$OLDPP run ov_${m}_old $O --model-path benchmarks/configs/$m
  PYTHONPATH=$NEWPP run ov_${m}_new2 $O --model-path benchmarks/configs/$m
done
echo "=== tests"
RADIXLM_TEST_TOKENIZER=$TOK timeout $((580 - SECONDS)) python -m pytest -q tests/test_gemv.py tests/test_fused_all_reduce_norm.py tests/test_pdl.py tests/test_gpu_tensor_parallel.py 2>&1 | tail -3
