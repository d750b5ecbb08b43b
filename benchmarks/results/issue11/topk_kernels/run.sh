bash .devrun/join.sh
mkdir -p .devrun/old && tar -xzf .devrun/old.tgz -C .devrun/old
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/s
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
timeout 150 python -m pytest -q -m gpu tests/test_logprob_kernels.py tests/test_sampler.py 2>&1 | tail -3
echo "elapsed $SECONDS"
timeout 150 python -m radixlm.bench.sampler --iters 30 --output $OUT/s/sampler.json 2>&1 | grep -v -i warn
echo "elapsed $SECONDS"
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
for i in 1 2; do
PYTHONPATH=$NEW timeout 100 python3 $B --output $OUT/s/structured_new_$i.json 2>&1 | grep "^structured"
PYTHONPATH=$OLD timeout 100 python3 $B --output $OUT/s/structured_old_$i.json 2>&1 | grep "^structured"
echo "elapsed $SECONDS"
[ $SECONDS -gt 400 ] && break
done
tar -czf $OUT/s.tgz -C $OUT s && rm -rf $OUT/s
echo "elapsed $SECONDS"
