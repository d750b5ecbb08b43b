source .devrun/env.sh
timeout 560 python .devrun/fp8v.py 2>&1 | grep -v Warning | tail -40
