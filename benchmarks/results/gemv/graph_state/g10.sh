source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
for w in bs1_off flinear gemv_own gemv_shared bs1; do
  echo "== $w"; python .devrun/probe3.py $M $w 2>&1 | grep -v "^\[\|Warn\|warn"
done
