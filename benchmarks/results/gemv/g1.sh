set -x
source .devrun/env.sh
TOK=$PWD/.tok
python -m pytest -q -m gpu tests/test_gemv.py 2>&1 | tail -3 | tee $OUT/pytest_gemv.txt
python -m radixlm.bench.gemv --output $OUT/gemv_rule.json 2>&1 | tail -32
python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --tokenizer-path $TOK \
  --tp-sizes 1 --batch-sizes 1 64 --output-len 256 --compare-gemv --kernel-table 15 \
  --output $OUT/tp1_8b_gemv_ab.json 2>&1 | grep -v "^\[" | tail -60
python -m pytest -q -m gpu tests/test_fused_ops.py -k tiny_model tests/test_gpu_engine.py 2>&1 | tail -3 | tee $OUT/pytest_gpu_engine.txt
