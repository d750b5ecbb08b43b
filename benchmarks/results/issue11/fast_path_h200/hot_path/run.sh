source .devrun/env.sh
mkdir -p $OUT/h
O="-m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/qwen3-0.6b --input-len 512"
OLD=$PWD/.devrun/old/python:$PYTHONPATH
for k in 1 2; do
timeout 80 python $O --batch-size 64 --output $OUT/h/overlap_qwen3_bs64_new_$k.json 2>&1 | grep -i "tok/s\|Error" | tail -1
PYTHONPATH=$OLD timeout 80 python $O --batch-size 64 --output $OUT/h/overlap_qwen3_bs64_old_$k.json 2>&1 | grep -i "tok/s\|Error" | tail -1
done
timeout 80 python $O --batch-size 1 --output $OUT/h/overlap_qwen3_bs1_new.json 2>&1 | grep -i "tok/s\|Error" | tail -1
PYTHONPATH=$OLD timeout 80 python $O --batch-size 1 --output $OUT/h/overlap_qwen3_bs1_old.json 2>&1 | grep -i "tok/s\|Error" | tail -1
