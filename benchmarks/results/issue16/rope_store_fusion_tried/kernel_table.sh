source .devrun/env.sh > /dev/null
for m in qwen3-30b-a3b deepseek-v2-lite; do
  echo "== $m no-PDL kernel table"
  RADIXLM_DISABLE_PDL=1 timeout 150 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/$m --batch-size 1 --input-len 1024 --steps 128 --kernel-table 16 --output $OUT/kt_$m.json 2>&1 | grep -i -E "tok/s" | tail -1
  python - <<PY
import json
d=json.load(open("$OUT/kt_$m.json")); on=d["overlap_on"]
print("step_ms", round(on["step_ms"],3))
for r in on["kernels_per_step"][:16]:
    print(f"{r['per_step']:6.0f} {r['us_per_step']:9.1f} us  {r['us_per_step']/max(r['per_step'],1):6.2f} us/launch  {r['name'][:70]}")
PY
done
