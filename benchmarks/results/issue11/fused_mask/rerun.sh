# A second `bench structured` pair on a fresh machine (third of three back-to-back calls, as
# run.sh), old (53ec940's python/) first this time, then new.
cat /root/part0 /root/part1 .devrun/g2/part > /root/smollm.gguf && rm /root/part0 /root/part1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
for v in old new; do
  if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
  T=110; [ $v = new ] && T=135
  PYTHONPATH=$PP timeout $T python3 $B --output $OUT/structured_${v}_2.json 2>&1 | grep "^structured"
  echo "elapsed $SECONDS"
done
