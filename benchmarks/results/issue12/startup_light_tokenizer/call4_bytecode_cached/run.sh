source .devrun/env.sh
# Bytecode cached, as a pip install leaves it (this machine sets PYTHONDONTWRITEBYTECODE=1 and its
# torch has no __pycache__, so every process compiles torch's sources on import).
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T='import time;t=time.time();from transformers import AutoTokenizer;t1=time.time();AutoTokenizer.from_pretrained(".tok");print("import %.2f load %.2f"%(t1-t,time.time()-t1))'
for i in 1 2; do python3 -c "$T"; done
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok --log-level warning"
i=0
for v in new prev new prev new prev new; do
  i=$((i+1))
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.prev/python; else PP=/tmp/site:$PWD/python; fi
  PYTHONPATH=$PP timeout 200 python3 -m radixlm.bench.startup --runs 1 --output $OUT/startup_pyc_${i}_${v}.json --server-args $SA 2>&1 | grep "run 1" | sed "s/^/$v: /"
done
