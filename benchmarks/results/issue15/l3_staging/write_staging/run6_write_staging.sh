#!/bin/bash
# Issue 15, write staging: GPU hicache tests, the write path alone (old = HEAD before the change,
# extracted to .old/python; new = the working tree), and the L3 script at TP1 with each (its
# first server's Q prefill queues the 8k prompt's writes).
source .devrun/env.sh
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -2
D=benchmarks/results/issue15/l3_staging/write_staging
for i in 1 2; do
  PYTHONPATH=$PWD/.old/python:$PYTHONPATH python3 $D/store_device.py --tokens 8192 --device cuda --label old --output $OUT/store_old_$i.json 2>&1 | tail -1
  python3 $D/store_device.py --tokens 8192 --device cuda --label new --output $OUT/store_new_$i.json 2>&1 | tail -1
done
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
timeout 150 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/ws_new_tp1.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
PYTHONPATH=$PWD/.old/python:$PYTHONPATH timeout 150 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/ws_old_tp1.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
