# Device call 1: PDL tests, then overlap benchmarks with PDL on / off (RADIXLM_DISABLE_PDL=1), alternated.
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/f
timeout 200 python -m pytest -q -m gpu tests/test_pdl.py tests/test_gemv.py tests/test_fused_ops.py 2>&1 | tail -3
echo "elapsed $SECONDS"
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/f/$tag.json 2>&1 | grep -E "^overlap|Error|error" | tail -3; }
B="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64"
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64"
for i in 1 2; do
ov overlap_8b_bs1_pdl_$i $B
RADIXLM_DISABLE_PDL=1 ov overlap_8b_bs1_nopdl_$i $B
echo "elapsed $SECONDS"
done
ov overlap_qwen3_bs64_pdl $Q
RADIXLM_DISABLE_PDL=1 ov overlap_qwen3_bs64_nopdl $Q
ov overlap_8b_fp8_bs1_pdl $B --quantization fp8
RADIXLM_DISABLE_PDL=1 ov overlap_8b_fp8_bs1_nopdl $B --quantization fp8
echo "elapsed $SECONDS"
tar -czf $OUT/f.tgz -C $OUT f && rm -rf $OUT/f
