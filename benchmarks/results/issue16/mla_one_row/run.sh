source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/old && tar -xzf .devrun/old.tgz -C /tmp/old
NEWP=$PYTHONPATH; OLDP=/tmp/site:/tmp/old/python:$PWD/tests
OV="python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 1024 --steps 128"
for r in "new deepseek-v2-lite" "old deepseek-v2-lite" "new deepseek-v2-lite" "old deepseek-v2-lite"; do
  set -- $r
  if [ $1 = old ]; then export PYTHONPATH=$OLDP; else export PYTHONPATH=$NEWP; fi
  echo "== $r"; timeout 100 $OV --model-path benchmarks/configs/$2 --output $OUT/ov_$1_$2_$RANDOM.json 2>&1 | grep "overlap bs"
done
export PYTHONPATH=$NEWP
echo "== new moe model bs1"; timeout 100 python -m radixlm.bench.moe --parts model --batch-sizes 1 --input-len 1024 --output-len 64 --model-path benchmarks/configs/deepseek-v2-lite --output $OUT/moe_new.json 2>&1 | tail -2
echo "== new kernel table (PDL off)"; RADIXLM_DISABLE_PDL=1 timeout 100 $OV --model-path benchmarks/configs/deepseek-v2-lite --kernel-table 30 --output $OUT/kt_new.json 2>&1 | grep -v -i warn | sed -n '/GPU time a step/,$p' | head -32
RADIXLM_TEST_TOKENIZER=$PWD/.devrun/tok RADIXLM_TEST_TOKENIZER_DIR=$PWD/.devrun/tok timeout 220 python -m pytest -q -m gpu tests/test_gpu_moe_mla.py tests/test_mla_decode_kernels.py tests/test_gemv.py tests/test_pdl.py -x 2>&1 | tail -4
