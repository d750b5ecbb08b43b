source .devrun/env.sh > /dev/null
bash .devrun/join.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
timeout 100 python -m pytest -q -m gpu tests/test_draw_kernels.py tests/test_sampler.py 2>&1 | tail -3
echo "elapsed $SECONDS"
timeout 80 python -m pytest -q -m gpu tests/test_gpu_engine.py -k "seeded_sampling" 2>&1 | tail -2
echo "elapsed $SECONDS"
ov() { tag=$1; shift; timeout 70 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/f/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
ov overlap_qwen3_bs64_topp09_final $Q --temperature 0.8 --top-p 0.9
ov overlap_qwen3_bs64_topk20_final $Q --temperature 0.8 --top-k 20
ov overlap_qwen3_bs64_temp08_final $Q --temperature 0.8
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests ov overlap_qwen3_bs64_topp09_old2 $Q --temperature 0.8 --top-p 0.9
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
