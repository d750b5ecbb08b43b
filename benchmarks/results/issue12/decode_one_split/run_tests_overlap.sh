source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/t $OUT/h
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
timeout 200 python -m pytest -q -m gpu tests/test_triton_attention.py tests/test_mla_attention.py tests/test_fp8_kv_cache.py 2>&1 | tail -4 | tee $OUT/t/pytest_gpu_attention.txt
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/h/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -2; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512"
E="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64"
for k in 1 2; do
PYTHONPATH=$NEW ov overlap_qwen3_bs64_new_$k $Q --batch-size 64
PYTHONPATH=$OLD ov overlap_qwen3_bs64_old_$k $Q --batch-size 64
done
PYTHONPATH=$NEW ov overlap_qwen3_bs1_new $Q --batch-size 1
PYTHONPATH=$OLD ov overlap_qwen3_bs1_old $Q --batch-size 1
PYTHONPATH=$NEW ov overlap_8b_bs1_new $E
PYTHONPATH=$OLD ov overlap_8b_bs1_old $E
echo "elapsed $SECONDS"
