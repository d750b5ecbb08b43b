source .devrun/env.sh >/dev/null
f() { python .devrun/probe9.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
f mixed 28; f mixed 8; f mixed 100; f adds 28; f linears 28; f norms 28
