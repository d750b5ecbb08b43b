source .devrun/env.sh > /dev/null
bash .devrun/join.sh
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
timeout 170 python -m pytest -q -m gpu tests/test_gpu_engine.py -k "optimistic or structured_jump or seeded_sampling" 2>&1 | tail -4
echo "elapsed $SECONDS"
timeout 150 python -m radixlm.bench.sampler --iters 30 --cases temperature,top_p,top_k20,top_k40+top_p,min_p,top_p+top_logprobs5,greedy --output $OUT/f/sampler.json 2>&1 | tail -30
echo "elapsed $SECONDS"
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/f/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
ov overlap_qwen3_bs64_topp09_new $Q --temperature 0.8 --top-p 0.9
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests ov overlap_qwen3_bs64_topp09_old $Q --temperature 0.8 --top-p 0.9
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
