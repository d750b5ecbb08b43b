source .devrun/env.sh > /dev/null
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
timeout 300 python .devrun/fp8_pair_sweep.py 2>&1 | grep -v "^skip" | tail -60
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
for i in 1 2; do
for v in new old; do
 if [ $v = old ]; then PP=$OLDPP; else PP=$PYTHONPATH; fi
 echo "== $v dsv2-lite bs1"
 PYTHONPATH=$PP python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/deepseek-v2-lite --input-len 1024 --steps 128 --output $OUT/ov_dsv2_${v}_$i.json 2>&1 | grep "^overlap bs"
done; done
python -m radixlm.bench.moe --parts mla --mla-batch-size 1 --mla-context 1024 --mla-heads 16,128 --output $OUT/mla_bs1.json 2>&1 | grep "mla decode" | head -8
