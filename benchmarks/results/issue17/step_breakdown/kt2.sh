source .devrun/env.sh
export RADIXLM_DISABLE_PDL=1
for q in none fp8 w4a16; do
 A=""; [ $q != none ] && A="--quantization $q"
 echo "=================== 8b $q no PDL"
 timeout 170 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/llama-3.1-8b --input-len 1024 --steps 64 $A --kernel-table 12 --output $OUT/kt_nopdl_8b_$q.json 2>&1 | grep -A13 "^GPU time a step" | tail -14
done
