source .devrun/env.sh
B="python3 -m radixlm.bench.overlap --load-format dummy --dtype bfloat16"
for v in prev new; do
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.devrun/prev/python; else PP=/tmp/site:$PWD/python; fi
  echo "== $v qwen3 bs1"; PYTHONPATH=$PP timeout 100 $B --model-path benchmarks/configs/qwen3-0.6b --batch-size 1 --input-len 512 --output $OUT/ovl_qwen3_bs1_${v}.json 2>&1 | grep -i "tok/s" | tail -2
  echo "== $v llama1b bs64"; PYTHONPATH=$PP timeout 100 $B --model-path benchmarks/configs/llama-3.2-1b --batch-size 64 --input-len 512 --output $OUT/ovl_1b_bs64_${v}.json 2>&1 | grep -i "tok/s" | tail -2
done
echo "== spec k8 new"; timeout 120 python3 -m radixlm.bench.spec --model-path /root/smollm.gguf --num-draft-tokens 8 --output $OUT/spec_new_k8.json 2>&1 | grep -E "^(copy|chat):"
echo "== tests"; timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graph_runner.py tests/test_gpu_engine.py -k "gpu_graphs or draft_trees or graphs_and_overlap or replay_pads" 2>&1 | tail -4 | tee $OUT/tests_gpu.txt
