source .devrun/env.sh >/dev/null
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
for o in descending ascending; do python .devrun/pergraph.py $C/llama-3.1-8b 256 $o 2>&1 | flt; done
python .devrun/pergraph.py $C/qwen3-0.6b 64 ascending 2>&1 | flt
mkdir -p $OUT/r
python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --output $OUT/r/overlap_qwen3_bs64_final.json 2>&1 | flt | tail -1
timeout 200 python -m pytest -q tests/test_gpu_engine.py -k random tests/test_gemv.py 2>&1 | tail -4
cd $OUT && tar czf r3.tgz r && rm -rf r
