source .devrun/env.sh > /dev/null
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_quantization.py tests/test_gemv.py -k "gated or one_row or graphs or gemv" 2>&1 | tail -3
for q in none fp8; do
 A=""; [ $q = fp8 ] && A="--quantization fp8"
 echo "== 8b $q"
 timeout 90 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --model-path benchmarks/configs/llama-3.1-8b --input-len 1024 --steps 128 $A --output $OUT/ov_8b_$q.json 2>&1 | grep "^overlap bs\|Error"
done
