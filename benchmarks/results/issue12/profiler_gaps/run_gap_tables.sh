source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/g
ov() { tag=$1; shift; timeout 120 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/g/$tag.json 2>&1 | grep -v -i "warn" | tail -45; }
ov gaps_qwen3_bs64 --model-path benchmarks/configs/qwen3-0.6b --input-len 512 --batch-size 64 --kernel-table 22 --gap-table 14
ov gaps_8b_bs1_fp8 --model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64 --quantization fp8 --kernel-table 26 --gap-table 14
ov gaps_8b_bs1 --model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64 --kernel-table 26 --gap-table 14
echo "elapsed $SECONDS"
