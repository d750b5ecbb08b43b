# Fifth call, right after ab_run.sh: Llama-3.2-1B bs 1 again, alternated (old first, then new,
# twice), then `bench structured` new vs automata off once more with 5 rounds.
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
L="--load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.2-1b --batch-size 1 --input-len 1024 --steps 128"
for r in 1 2; do
  for v in new old; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    echo "== overlap llama1b bs1 $v $r"
    PYTHONPATH=$PP timeout 100 python -m radixlm.bench.overlap $L --output $OUT/llama1b_bs1_${v}_$r.json 2>&1 | grep -i -E "tok/s|step" | tail -1
  done
done
echo "elapsed $SECONDS"
ls /root/smollm.gguf || exit 0
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 5"
timeout 170 python3 $B --output $OUT/structured_new_r5.json 2>&1 | grep "^structured"
echo "elapsed $SECONDS"
RADIXLM_DISABLE_GRAMMAR_AUTOMATA=1 timeout 170 python3 $B --output $OUT/structured_off_r5.json 2>&1 | grep "^structured"
echo "elapsed $SECONDS"
