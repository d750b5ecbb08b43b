source .devrun/env.sh >/dev/null 2>&1
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 100 python -m pytest -q -m gpu tests/test_quantization.py -k "one_row or cuda_graphs or kernels_match" -p no:cacheprovider 2>&1 | tail -4
timeout 200 python -m radixlm.bench.quant --parts gemv-sweep --gemv-ms 1 --output $OUT/gemv_sweep2.json 2>&1 | grep -v "^  .*: " | grep -v "^  sweep" > $OUT/sweep2.txt
grep -v sweep $OUT/sweep2.txt; grep -A3 -m99 "w4_new" $OUT/sweep2.txt | head -0
python - <<'PY'
import json; d=json.load(open("/root/out/gemv_sweep2.json"))["gemv"]
for r in d["rows"]:
    for k in ("fp8_sweep","fp8_block_sweep","w4_sweep"):
        print(r["shape"], k, [(round(x["us"],1), tuple(x["tiles"].values())) for x in r.get(k, [])[:3]])
PY
M=benchmarks/configs/llama-3.1-8b
for q in none fp8 w4a16; do
  for old in 0 1; do
    [ $q = none ] && [ $old = 1 ] && continue
    QF=""; [ $q != none ] && QF="--quantization $q"
    RADIXLM_DISABLE_QUANT_GEMV=$old timeout 120 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $M --batch-size 1 --input-len 1024 --steps 64 $QF --output $OUT/overlap_${q}_old$old.json 2>&1 | grep "overlap bs" | sed "s/^/$q old=$old: /"
  done
done
