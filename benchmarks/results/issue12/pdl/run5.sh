# Device call 5 (after .devrun/s1.sh stored the first half of the GGUF): structured and speculative benchmarks
# new vs old (the previous commit), then the GPU tests of the changed kernels and the engine.
bash .devrun/join.sh
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/r /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
NEW=$PYTHONPATH; OLD=/tmp/site:/tmp/old/python:$PWD/tests
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
PYTHONPATH=$NEW timeout 150 python3 $B --output $OUT/r/structured_new.json 2>&1 | grep -v -i "warn\|it/s\|s/it" | tail -8
echo "elapsed $SECONDS"
PYTHONPATH=$OLD timeout 150 python3 $B --output $OUT/r/structured_old.json 2>&1 | grep -v -i "warn\|it/s\|s/it" | tail -8
echo "elapsed $SECONDS"
S="-m radixlm.bench.spec --model-path /root/smollm.gguf --num-draft-tokens 8"
PYTHONPATH=$NEW timeout 80 python3 $S --output $OUT/r/spec_new.json 2>&1 | grep -v -i warn | tail -4
PYTHONPATH=$OLD timeout 80 python3 $S --output $OUT/r/spec_old.json 2>&1 | grep -v -i warn | tail -4
echo "elapsed $SECONDS"
left=$((560 - SECONDS))
[ $left -gt 60 ] && PYTHONPATH=$NEW timeout $left python3 -m pytest -q -m gpu tests/test_pdl.py tests/test_gemv.py tests/test_gpu_engine.py -k "pdl or gemv or graphs_and_overlap or structured_jump" 2>&1 | tail -3
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
echo "elapsed $SECONDS"
