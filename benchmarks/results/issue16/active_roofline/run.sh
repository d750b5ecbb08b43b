source .devrun/env.sh > /dev/null
OV="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128 --kernel-table 45"
for m in qwen3-30b-a3b deepseek-v2-lite; do
  echo "== $m"; timeout 150 $OV --model-path benchmarks/configs/$m --output $OUT/ov_$m.json 2>&1 | grep -v -i "warn" | tail -60
done
