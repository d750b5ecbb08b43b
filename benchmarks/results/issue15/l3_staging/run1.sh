#!/bin/bash
# Issue 15: the L3 hit through the staging arena (new) against HEAD's path (.old), one H200.
source .devrun/env.sh
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok"
nproc; python3 -c "import zlib,hashlib,os,time; d=os.urandom(8<<20); t=time.perf_counter(); [hashlib.sha256(d).digest() for _ in range(20)]; print('sha256 GB/s', 20*8/1024/(time.perf_counter()-t))"
timeout 240 python3 -m pytest -q -x tests/test_gpu_hicache.py 2>&1 | tail -3
S=benchmarks/results/issue15/l3/l3_vs_recompute.py
for code in new old; do
  if [ $code = old ]; then export PYTHONPATH=/tmp/site:$PWD/.old/python; fi
  timeout 200 python3 $S --server-args "$SA" --tokens 8000 --output $OUT/${code}_hot.json 2>&1 | grep "^L3\|Error\|error" | tail -3
done
export PYTHONPATH=/tmp/site:$PWD/python
timeout 150 python3 $S --server-args "$SA" --tokens 16000 --output $OUT/new_hot_16k.json 2>&1 | grep "^L3\|Error\|error" | tail -3
