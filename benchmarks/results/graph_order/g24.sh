source .devrun/env.sh >/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
for m in qwen3-0.6b llama-3.2-1b llama-3.1-8b; do for o in descending ascending; do
  python .devrun/pergraph.py $C/$m 64 $o 2>&1 | flt
done; done
mkdir -p $OUT/r
for rep in 1 2; do for o in descending ascending; do
  echo "== overlap qwen3 bs64 $o"
  python .devrun/order.py $o -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --output $OUT/r/overlap_qwen3_bs64_${o}_$rep.json 2>&1 | flt | tail -2
done; done
cd $OUT && tar czf r1.tgz r && rm -rf r
