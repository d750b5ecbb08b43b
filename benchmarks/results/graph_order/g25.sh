source .devrun/env.sh >/dev/null
cat /root/smollm_a .gguf2/b > /root/smollm.gguf && ls -la /root/smollm.gguf
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
mkdir -p $OUT/r
for o in descending ascending; do
  echo "== overlap qwen3 bs1 $o"; python .devrun/order.py $o -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 1 --input-len 512 --output $OUT/r/overlap_qwen3_bs1_$o.json 2>&1 | flt | tail -1
  echo "== overlap 1b bs1 $o"; python .devrun/order.py $o -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/llama-3.2-1b --batch-size 1 --input-len 1024 --output $OUT/r/overlap_1b_bs1_$o.json 2>&1 | flt | tail -1
  echo "== overlap 1b bs64 $o"; python .devrun/order.py $o -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/llama-3.2-1b --batch-size 64 --input-len 512 --output $OUT/r/overlap_1b_bs64_$o.json 2>&1 | flt | tail -1
done
for o in descending ascending; do
  echo "== structured $o"
  timeout 240 python .devrun/order.py $o -m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3 --output $OUT/r/structured_$o.json 2>&1 | flt | tail -14
done
cd $OUT && tar czf r2.tgz r && rm -rf r
