source .devrun/env.sh >/dev/null
TOK=$PWD/.tok
C=benchmarks/configs
ab() {  # ab NAME CMD...: the command with the GEMV off, then on (same machine)
  name=$1; shift
  for v in off on; do
    if [ $v = off ]; then export RADIXLM_DISABLE_GEMV=1; else unset RADIXLM_DISABLE_GEMV; fi
    echo "== $name gemv $v"
    timeout 300 "$@" --output $OUT/${name}_$v.json 2>&1 | grep -v "^\[\|Warning\|_warn_once\|^INFO\|^WARNING" | tail -4
  done
  unset RADIXLM_DISABLE_GEMV
}
# start-up with a cold Triton cache each (the GEMV kernels compile at the first batch-1 capture)
for v in off on; do
  if [ $v = off ]; then export RADIXLM_DISABLE_GEMV=1; else unset RADIXLM_DISABLE_GEMV; fi
  export TRITON_CACHE_DIR=/tmp/triton_cold_$v
  echo "== startup cold gemv $v"
  python -m radixlm.bench.startup --runs 1 --output $OUT/startup_cold_$v.json --server-args --model-path \
    $C/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $TOK \
    --log-level warning 2>&1 | tail -2
done
unset TRITON_CACHE_DIR RADIXLM_DISABLE_GEMV
ab overlap_8b_bs1 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64
ab overlap_8b_bs1_again python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64
ab overlap_qwen3_bs1 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 1 --input-len 512 --steps 64
ab overlap_1b_bs1 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/llama-3.2-1b --batch-size 1 --input-len 1024 --steps 64
echo "== overlap qwen3 bs64 (gemv not taken)"
python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512 --output $OUT/overlap_qwen3_bs64.json 2>&1 | tail -2
echo "== headline"
timeout 240 python -m radixlm.bench.headline --model-path $C/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $TOK --output $OUT/headline.json 2>&1 | tail -3
