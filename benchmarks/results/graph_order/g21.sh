source .devrun/env.sh >/dev/null
f() { python .devrun/probe11.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
for v in trivial_before trivial_after own_pool no_warm other_fn relaxed inference no_replay; do f $v; done
