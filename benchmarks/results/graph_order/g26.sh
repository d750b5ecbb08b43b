source .devrun/env.sh >/dev/null
C=benchmarks/configs
flt() { grep -v "^\[W\|Warn\|warn\|^STAGE\|^$\|^INFO\|^WARNING\|it/s\]\|tok/s\]"; }
for o in descending ascending; do python .devrun/pergraph.py $C/llama-3.1-8b 256 $o 2>&1 | flt; done
timeout 330 python -m pytest -q -x tests/test_gpu_engine.py tests/test_gemv.py 2>&1 | tail -6
