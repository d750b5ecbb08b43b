source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/d
dk() { tag=$1; shift; timeout 150 python -m radixlm.bench.decode_kernel "$@" --output $OUT/d/$tag.json 2>&1 | grep -v -i warn | tail -7; echo "elapsed $SECONDS"; }
dk qwen3_bs64_ctx512 --batch-size 64 --context 512 --num-heads 16 --num-kv-heads 8 --head-dim 128 --splits 1,2,4
dk l8b_bs1_ctx1k --batch-size 1 --context 1024 --num-heads 32 --num-kv-heads 8 --head-dim 128 --splits 8,16,32
dk qwen3_bs32_ctx512 --batch-size 32 --context 512 --num-heads 16 --num-kv-heads 8 --head-dim 128 --splits 1,2,4
dk l1b_bs256_ctx4k --batch-size 256 --context 4096 --num-heads 32 --num-kv-heads 8 --head-dim 64 --splits 1,2
tar -czf $OUT/d.tgz -C $OUT d && rm -rf $OUT/d
