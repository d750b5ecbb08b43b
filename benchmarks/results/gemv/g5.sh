source .devrun/env.sh >/dev/null
TOK=$PWD/.tok
C=benchmarks/configs
mkdir -p $OUT/r
ab() {  # ab NAME CMD...: the command with the GEMV off, then on (same machine)
  name=$1; shift
  for v in on off; do
    if [ $v = off ]; then export RADIXLM_DISABLE_GEMV=1; else unset RADIXLM_DISABLE_GEMV; fi
    echo "== $name gemv $v"
    timeout 300 "$@" --output $OUT/r/${name}_$v.json 2>&1 | grep -v "^\[\|Warning\|_warn_once\|^INFO\|^WARNING\|it/s\]\|tok/s\]" | tail -3
  done
  unset RADIXLM_DISABLE_GEMV
}
ab overlap_qwen3_bs64_rev python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --model-path $C/qwen3-0.6b --batch-size 64 --input-len 512

ab programs_8b_rev python -m radixlm.bench.programs --model-path $C/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --tokenizer-path $TOK --attention-backend triton --num-programs 32
cd $OUT && tar czf r.tgz r && rm -rf r
