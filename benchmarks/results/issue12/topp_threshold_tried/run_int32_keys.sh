source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/u
timeout 80 python -m pytest -q -m gpu tests/test_threshold_kernels.py tests/test_sampler.py 2>&1 | tail -4
echo "elapsed $SECONDS"
timeout 60 python -m radixlm.bench.sampler --vocabs 49152,151936 --batch-sizes 1,64,256 --cases top_p,top_k20,top_k40+top_p --iters 20 --output $OUT/u/sampler.json 2>&1 | grep -v -i warn
echo "elapsed $SECONDS"
ov() { tag=$1; shift; timeout 40 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/u/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
ov overlap_qwen3_bs64_topp09 $Q --temperature 0.8 --top-p 0.9
ov overlap_qwen3_bs64_topk20 $Q --temperature 0.8 --top-k 20
echo "elapsed $SECONDS"
tar -czf $OUT/u.tgz -C $OUT u && rm -rf $OUT/u
