source .devrun/env.sh >/dev/null
M=benchmarks/configs/qwen3-0.6b
f() { python .devrun/probe6.py $M "$1" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; echo ---; }
f trace
f empty_cache,gc,bigalloc
f stream,raw
f reinst
CUDA_DEVICE_MAX_CONNECTIONS=1 f ctx
CUDA_DEVICE_MAX_CONNECTIONS=32 f ctx
