source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/f/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
ov overlap_qwen3_bs64_topk20_new $Q --temperature 0.8 --top-k 20
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests ov overlap_qwen3_bs64_topk20_old $Q --temperature 0.8 --top-k 20
ov overlap_qwen3_bs64_temp08_new $Q --temperature 0.8
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests ov overlap_qwen3_bs64_temp08_old $Q --temperature 0.8
ov overlap_qwen3_bs64_greedy_new $Q
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
