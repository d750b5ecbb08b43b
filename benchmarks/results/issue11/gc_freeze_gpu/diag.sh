# Third of three back-to-back calls on a fresh machine (as run.sh): (1) issue 11's command with
# --mask-batch-sizes 1,8,256 on this tree with its progress timestamped (in run.sh it ran past
# 125 s twice where 53ec940's tree took 92 s); (2) the in-process scheduler at bs 64/256,
# unconstrained vs constrained vs mixed (mixed_profile.py), to see where the half-constrained
# figure's extra step time goes.
cat /root/part0 /root/part1 .devrun/g2/part > /root/smollm.gguf && rm /root/part0 /root/part1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc
D=benchmarks/results/issue11/gc_freeze_gpu
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
timeout 230 python3 $B --output $OUT/structured_diag.json 2>&1 | tr '\r' '\n' | python3 -u -c "
import sys, time; t0 = time.time()
for line in sys.stdin: print(f'{time.time() - t0:7.1f} {line}', end='')" > $OUT/structured_diag.log
grep "^ *[0-9.]* structured" $OUT/structured_diag.log
echo "elapsed $SECONDS"
timeout $((560 - SECONDS)) python3 $D/mixed_profile.py /root/smollm.gguf $OUT 2>&1 | grep -v -i warn | tail -42
echo "elapsed $SECONDS"
