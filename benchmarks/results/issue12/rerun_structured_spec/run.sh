bash .devrun/join.sh
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/r
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
PYTHONPATH=$NEW timeout 150 python3 $B --output $OUT/r/structured_new.json 2>&1 | grep -v -i "warn\|it/s\|s/it" | tail -12
echo "elapsed $SECONDS"
PYTHONPATH=$OLD timeout 150 python3 $B --output $OUT/r/structured_old.json 2>&1 | grep -v -i "warn\|it/s\|s/it" | tail -12
echo "elapsed $SECONDS"
S="-m radixlm.bench.spec --model-path /root/smollm.gguf --num-draft-tokens 8"
PYTHONPATH=$NEW timeout 80 python3 $S --output $OUT/r/spec_new.json 2>&1 | grep -v -i warn | tail -5
PYTHONPATH=$OLD timeout 80 python3 $S --output $OUT/r/spec_old.json 2>&1 | grep -v -i warn | tail -5
echo "elapsed $SECONDS"
PYTHONPATH=$NEW timeout 80 python3 $S --temperature 0.8 --output $OUT/r/spec_t08_new.json 2>&1 | grep -v -i warn | tail -5
PYTHONPATH=$OLD timeout 80 python3 $S --temperature 0.8 --output $OUT/r/spec_t08_old.json 2>&1 | grep -v -i warn | tail -5
echo "elapsed $SECONDS"
left=$((570 - SECONDS))
[ $left -gt 60 ] && PYTHONPATH=$NEW timeout $left python3 -m pytest -q -m gpu tests/test_gpu_engine.py -k "structured or optimistic or bundled or logprob" 2>&1 | tail -3
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
echo "elapsed $SECONDS"
