source .devrun/env.sh >/dev/null
f() { python .devrun/probe10.py "$@" 2>&1 | grep -v "^\[W\|Warn\|warn\|^STAGE\|^$"; }
f mixed 28 same; f mixed 28 new; f mixed 28 replay_on_capture_stream
python - <<'PY'
import torch
ss = [torch.cuda.Stream() for _ in range(40)]
print("pool stream ids:", [s.stream_id for s in ss][:8], "...", len({s.cuda_stream for s in ss}), "distinct of 40")
PY
