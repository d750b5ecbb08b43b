source .devrun/env.sh
for d in float32 bfloat16; do timeout 200 python3 .devrun/fp32chat.py $d 2>&1 | grep "identical" ; done
bash .devrun/ovl.sh
