source .devrun/env.sh >/dev/null
C=benchmarks/configs
for v in on off on off; do
  if [ $v = off ]; then export RADIXLM_DISABLE_GEMV=1; else unset RADIXLM_DISABLE_GEMV; fi
  echo "== overlap qwen3 bs64 gemv $v"
  python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --steps 400 --output /tmp/x.json 2>&1 | tail -1
done
for v in on off; do
  if [ $v = off ]; then export RADIXLM_DISABLE_GEMV=1; else unset RADIXLM_DISABLE_GEMV; fi
  echo "== one_batch qwen3 bs64 gemv $v"
  python -m radixlm.bench.one_batch --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --output-len 64 --profile 2>&1 | grep -v "^\[\|Warn\|warn" | tail -22 | cut -c1-160
done
