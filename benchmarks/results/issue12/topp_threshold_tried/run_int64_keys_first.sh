source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p .devrun/old && tar -xzf .devrun/old.tgz -C .devrun/old
mkdir -p $OUT/t
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
timeout 120 python -m pytest -q -m gpu tests/test_threshold_kernels.py tests/test_logprob_kernels.py tests/test_sampler.py 2>&1 | tail -4
echo "elapsed $SECONDS"
timeout 120 python -m radixlm.bench.sampler --vocabs 49152,151936 --batch-sizes 1,64,256 --cases greedy,top_p,top_k20,top_k40+top_p,min_p --iters 30 --output $OUT/t/sampler.json 2>&1 | grep -v -i warn
echo "elapsed $SECONDS"
ov() { tag=$1; shift; timeout 90 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/t/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64 --temperature 0.8 --top-p 0.9"
PYTHONPATH=$NEW ov overlap_qwen3_bs64_topp_new $Q
PYTHONPATH=$OLD ov overlap_qwen3_bs64_topp_old $Q
echo "elapsed $SECONDS"
tar -czf $OUT/t.tgz -C $OUT t && rm -rf $OUT/t
