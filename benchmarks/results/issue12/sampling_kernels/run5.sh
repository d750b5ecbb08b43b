source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
T=$PWD/.devrun/tok
OFF="-m radixlm.bench.offline --dataset nano-vllm --model-path benchmarks/configs/qwen3-0.6b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
timeout 60 python $OFF --output $OUT/f/offline_final.json 2>&1 | grep -E "^offline|Error" | tail -2
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests timeout 60 python $OFF --output $OUT/f/offline_old3.json 2>&1 | grep -E "^offline|Error" | tail -2
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
