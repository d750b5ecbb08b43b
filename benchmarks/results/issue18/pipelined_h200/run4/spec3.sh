source .devrun/env.sh
M=/root/smollm.gguf
NEW="python3 -m radixlm.bench.spec --model-path $M --num-draft-tokens 16"
f() { grep -E "^(copy|chat):" ; }
echo "== pipelined (gate 0.5) k16"; timeout 130 $NEW --output $OUT/spec_gated_k16.json 2>&1 | f
echo "== waits k16"; RADIXLM_DISABLE_SPEC_PIPELINE=1 timeout 130 $NEW --output $OUT/spec_waits_k16.json 2>&1 | f
