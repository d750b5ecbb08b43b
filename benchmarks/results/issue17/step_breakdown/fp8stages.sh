source .devrun/env.sh
timeout 560 python .devrun/fp8stages.py 2>&1 | grep -v Warning | tail -40
