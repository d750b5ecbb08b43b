source .devrun/env.sh
M=/root/smollm.gguf
for n in 1 2; do
  echo "== spec k16 final ($n)"; timeout 150 python3 -m radixlm.bench.spec --model-path $M --num-draft-tokens 16 --output $OUT/spec_final_k16_$n.json 2>&1 | grep -E "^(copy|chat):"
done
