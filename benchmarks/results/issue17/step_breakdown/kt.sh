source .devrun/env.sh
for q in none fp8 w4a16; do
 A=""; [ $q != none ] && A="--quantization $q"
 echo "=================== 8b $q"
 timeout 170 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/llama-3.1-8b --input-len 1024 --steps 128 $A --kernel-table 22 --gap-table 6 --output $OUT/kt_8b_$q.json 2>&1 | grep -v "^\[\|Warning\|warn" | tail -45
done
