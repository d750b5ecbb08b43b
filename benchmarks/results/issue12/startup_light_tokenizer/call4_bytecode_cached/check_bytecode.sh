source .devrun/env.sh
python3 - <<'PY'
import sys, os, importlib.util
spec = importlib.util.find_spec("transformers"); d = os.path.dirname(spec.origin)
print("dont_write_bytecode", sys.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"), "pycache_prefix", sys.pycache_prefix)
print(d, "writable", os.access(d, os.W_OK), "has __pycache__", os.path.isdir(os.path.join(d, "__pycache__")))
td = os.path.dirname(importlib.util.find_spec("torch").origin)
print(td, "writable", os.access(td, os.W_OK), "has __pycache__", os.path.isdir(os.path.join(td, "__pycache__")))
PY
T='import time;t=time.time();from transformers import AutoTokenizer;t1=time.time();AutoTokenizer.from_pretrained(".tok");print("import %.2f load %.2f"%(t1-t,time.time()-t1))'
for i in 1 2; do python3 -c "$T"; done
for i in 1 2 3; do PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c "$T"; done
