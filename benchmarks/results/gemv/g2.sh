source .devrun/env.sh
TOK=$PWD/.tok
nvidia-smi --query-gpu=name --format=csv,noheader | head -4
python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-8b --tokenizer-path $TOK \
  --tp-sizes 1 2 4 --batch-sizes 1 --output-len 256 --compare-gemv --kernel-table 12 \
  --output $OUT/tp_8b_gemv_ab.json 2>&1 | grep -v "^\[\|Warning\|_warn_once" | tail -30
python -m radixlm.bench.tp --model-path benchmarks/configs/llama-3.1-70b --tokenizer-path $TOK \
  --tp-sizes 4 --batch-sizes 1 --output-len 256 --compare-gemv --no-profile \
  --engine-args "--mem-fraction-static 0.9" \
  --output $OUT/tp_70b_gemv_ab.json 2>&1 | grep -v "^\[\|Warning\|_warn_once" | tail -12
timeout 300 python -m pytest -q -m gpu tests/test_gpu_tensor_parallel.py tests/test_gemv.py 2>&1 | tail -3 | tee $OUT/pytest_tp.txt
