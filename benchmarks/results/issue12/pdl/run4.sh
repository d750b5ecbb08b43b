# Device call 4: final code (PDL at batch 1) against the previous commit (old), alternated: batch-1 overlap runs
# (bf16 Qwen3-0.6B, Llama-3.2-1B, Llama-3.1-8B; FP8 and 4-bit 8B), then the headline (new, then old).
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/k /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDP=/tmp/site:/tmp/old/python:$PWD/tests
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/k/$tag.json 2>&1 | grep -E "^overlap|Error|error" | tail -3; }
B8="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 128"
for args in "qwen3_bs1|--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 1 --steps 256" \
            "1b_bs1|--model-path benchmarks/configs/llama-3.2-1b --input-len 1024 --batch-size 1 --steps 256" \
            "8b_bs1|$B8" "8b_fp8_bs1|$B8 --quantization fp8" "8b_w4a16_bs1|$B8 --quantization w4a16"; do
  tag=${args%%|*}; a=${args#*|}
  ov overlap_${tag}_new $a
  PYTHONPATH=$OLDP ov overlap_${tag}_old $a
  echo "elapsed $SECONDS"
done
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.devrun/tok"
timeout 200 python $H --output $OUT/k/headline_new.json 2>&1 | grep -iE "headline|error|e2e|floor" | tail -4
echo "elapsed $SECONDS"
left=$((560 - SECONDS))
[ $left -gt 100 ] && PYTHONPATH=$OLDP timeout $left python $H --output $OUT/k/headline_old.json 2>&1 | grep -iE "headline|error|e2e|floor" | tail -4
echo "elapsed $SECONDS"
tar -czf $OUT/k.tgz -C $OUT k && rm -rf $OUT/k
