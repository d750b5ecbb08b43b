source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f
T=$PWD/.devrun/tok
ov() { tag=$1; shift; timeout 90 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/f/$tag.json 2>&1 | grep -E "^overlap|Error" | tail -3; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
ov overlap_qwen3_bs64_greedy $Q
ov overlap_qwen3_bs64_topp09 $Q --temperature 0.8 --top-p 0.9
ov overlap_qwen3_bs64_topk20 $Q --temperature 0.8 --top-k 20
echo "elapsed $SECONDS"
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
timeout 100 python3 $H --output $OUT/f/headline.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
