source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
for w in replay_only norm flinear; do
  echo "== $w"; python .devrun/probe3.py $M $w 2>&1 | grep -v "^\[\|Warn\|warn"
done
echo "== flinear, CUDA_MODULE_LOADING=EAGER"; CUDA_MODULE_LOADING=EAGER python .devrun/probe3.py $M flinear 2>&1 | grep -v "^\[\|Warn\|warn"
echo "== bs1 (gemv on), CUDA_MODULE_LOADING=EAGER"; CUDA_MODULE_LOADING=EAGER python .devrun/probe3.py $M bs1 2>&1 | grep -v "^\[\|Warn\|warn"
