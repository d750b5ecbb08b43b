# Device call 3: where PDL stops paying: Qwen3-0.6B at batch 2-32 and Llama-3.1-8B at batch 8, PDL for every batch size vs off.
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/h
ov() { tag=$1; shift; timeout 120 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/h/$tag.json 2>&1 | grep -E "^overlap|Error|error" | tail -3; }
for bs in 2 4 8 16 32; do
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size $bs --steps 256"
RADIXLM_PDL_MAX_ROWS=100000 ov overlap_qwen3_bs${bs}_pdl $Q
RADIXLM_DISABLE_PDL=1 ov overlap_qwen3_bs${bs}_nopdl $Q
echo "elapsed $SECONDS"
done
B="--model-path benchmarks/configs/llama-3.1-8b --batch-size 8 --input-len 1024 --steps 128"
RADIXLM_PDL_MAX_ROWS=100000 ov overlap_8b_bs8_pdl $B
RADIXLM_DISABLE_PDL=1 ov overlap_8b_bs8_nopdl $B
B="--model-path benchmarks/configs/llama-3.2-1b --batch-size 1 --input-len 1024 --steps 256"
ov overlap_1b_bs1_pdl $B
RADIXLM_DISABLE_PDL=1 ov overlap_1b_bs1_nopdl $B
echo "elapsed $SECONDS"
tar -czf $OUT/h.tgz -C $OUT h && rm -rf $OUT/h
