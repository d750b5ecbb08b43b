source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
T=$PWD/.devrun/tok
OFF="-m radixlm.bench.offline --dataset nano-vllm --model-path benchmarks/configs/qwen3-0.6b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
for i in 1 2; do
timeout 80 python $OFF --output $OUT/f/offline_new_$i.json 2>&1 | grep -E "tok/s|Error" | tail -2
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests timeout 80 python $OFF --output $OUT/f/offline_old_$i.json 2>&1 | grep -E "tok/s|Error" | tail -2
echo "elapsed $SECONDS"
done
if [ -f /root/smollm.gguf ]; then
PR="-m radixlm.bench.programs --model-path /root/smollm.gguf --attention-backend triton --num-programs 32"
timeout 80 python $PR --output $OUT/f/programs_new.json 2>&1 | tail -3
PYTHONPATH=/tmp/site:/tmp/old/python:$PWD/tests timeout 80 python $PR --output $OUT/f/programs_old.json 2>&1 | tail -3
fi
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
