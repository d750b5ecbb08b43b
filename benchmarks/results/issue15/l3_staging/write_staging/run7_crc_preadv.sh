#!/bin/bash
# Issue 15, write staging + CRC32 files read by preadv: GPU hicache tests, the read and write
# paths alone, the L3 script at TP1 (page cache hot twice, dropped once).
source .devrun/env.sh
timeout 200 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -2
D=benchmarks/results/issue15/l3_staging
python3 $D/fetch_device.py --tokens 8192 --device cuda --repeats 3 2>&1 | tail -4
python3 $D/write_staging/store_device.py --tokens 8192 --device cuda --label new --output $OUT/store_crc.json 2>&1 | tail -1
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
for i in 1 2; do
  timeout 150 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --output $OUT/crc_tp1_hot_$i.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
done
timeout 150 python3 $S --server-args "$SA" --tokens 8000 --warm-prefix-path --drop-page-cache --output $OUT/crc_tp1_dropped.json 2>&1 | grep "^L3\|Error\|error\|Traceback" | tail -5
