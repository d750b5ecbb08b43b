# Fourth call, right after run.sh on the same machine: the hot-path check (old = 53ec940's
# python/, new = this tree; benchmarks/hot_path_ab.sh), then `bench structured` with 10 timed
# mask-overhead rounds instead of the 3, new and old.
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPYCACHEPREFIX=/tmp/pyc
if [ ! -d /tmp/old/python ]; then  # a fresh machine after all: the wheels and the old tree again
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -1
  mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
fi
OLDPP=/tmp/site:/tmp/old/python:$PWD/tests
NEWPP=$PYTHONPATH
bash benchmarks/hot_path_ab.sh $OLDPP $NEWPP $OUT
B="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-tokens 64 --repeats 10"
if [ -f /root/smollm.gguf ]; then
  for v in new old; do
    if [ $v = old ]; then PP=$OLDPP; else PP=$NEWPP; fi
    [ $SECONDS -gt 480 ] && break
    PYTHONPATH=$PP timeout 110 python3 $B --output $OUT/structured_r10_${v}.json 2>&1 | grep "^structured"
    echo "elapsed $SECONDS"
  done
fi
