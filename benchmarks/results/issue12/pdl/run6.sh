# Device call 6: PDL in the FP8 and 4-bit one-row kernels (new) against the previous commit (old: PDL in the
# other batch-1 kernels only), Llama-3.1-8B shape at batch 1, alternated; then their GPU tests.
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/q /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
OLDP=/tmp/site:/tmp/old/python:$PWD/tests
ov() { t=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/q/$t.json 2>&1 | grep -E "^overlap|Error|error" | tail -3; }
B8="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 128"
for i in 1 2; do
ov overlap_8b_fp8_bs1_new_$i $B8 --quantization fp8
PYTHONPATH=$OLDP ov overlap_8b_fp8_bs1_old_$i $B8 --quantization fp8
echo "elapsed $SECONDS"
done
ov overlap_8b_w4a16_bs1_new $B8 --quantization w4a16
PYTHONPATH=$OLDP ov overlap_8b_w4a16_bs1_old $B8 --quantization w4a16
echo "elapsed $SECONDS"
left=$((270 - SECONDS))
[ $left -gt 30 ] && timeout $left python -m pytest -q -m gpu tests/test_quantization.py -x 2>&1 | tail -3
echo "elapsed $SECONDS"
tar -czf $OUT/q.tgz -C $OUT q && rm -rf $OUT/q
