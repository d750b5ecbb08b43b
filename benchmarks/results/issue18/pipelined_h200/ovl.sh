source .devrun/env.sh
B="python3 -m radixlm.bench.overlap --load-format dummy --dtype bfloat16"
for i in 1; do
for v in old new; do
  if [ $v = old ]; then PP=/tmp/site:$PWD/.devrun/old/python; else PP=/tmp/site:$PWD/python; fi
  echo "== $v qwen3 bs1"; PYTHONPATH=$PP timeout 100 $B --model-path benchmarks/configs/qwen3-0.6b --batch-size 1 --input-len 512 --output $OUT/ovl_qwen3_bs1_${v}_$i.json 2>&1 | grep -i "tok/s" | tail -2
  echo "== $v llama1b bs64"; PYTHONPATH=$PP timeout 100 $B --model-path benchmarks/configs/llama-3.2-1b --batch-size 64 --input-len 512 --output $OUT/ovl_1b_bs64_${v}_$i.json 2>&1 | grep -i "tok/s" | tail -2
done; done
