# Device call 2: longer overlap runs, PDL on / off alternated twice (Qwen3 bs 64, 8B bs 1), one-batch 1B bs 256.
source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/g
ov() { tag=$1; shift; timeout 120 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/g/$tag.json 2>&1 | grep -E "^overlap|Error|error" | tail -3; }
B="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 256"
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64 --steps 400"
for i in 1 2; do
RADIXLM_DISABLE_PDL=1 ov overlap_qwen3_bs64_nopdl_$i $Q
ov overlap_qwen3_bs64_pdl_$i $Q
echo "elapsed $SECONDS"
done
ov overlap_qwen3_bs64_pdl_table $Q --kernel-table 14
RADIXLM_DISABLE_PDL=1 ov overlap_qwen3_bs64_nopdl_table $Q --kernel-table 14
RADIXLM_DISABLE_PDL=1 ov overlap_8b_bs1_nopdl_3 $B
ov overlap_8b_bs1_pdl_3 $B
Q1="--model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 1 --steps 256"
RADIXLM_DISABLE_PDL=1 ov overlap_qwen3_bs1_nopdl $Q1
ov overlap_qwen3_bs1_pdl $Q1
echo "elapsed $SECONDS"
OB="-m radixlm.bench.one_batch --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --batch-size 256 --input-len 512 --output-len 32"
timeout 120 python $OB --output $OUT/g/ob_1b_pdl.json 2>&1 | grep -iE "decode|error" | tail -2
RADIXLM_DISABLE_PDL=1 timeout 120 python $OB --output $OUT/g/ob_1b_nopdl.json 2>&1 | grep -iE "decode|error" | tail -2
echo "elapsed $SECONDS"
tar -czf $OUT/g.tgz -C $OUT g && rm -rf $OUT/g
