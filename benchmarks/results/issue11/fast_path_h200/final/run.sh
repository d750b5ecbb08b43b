bash .devrun/join.sh
source .devrun/env.sh
mkdir -p $OUT/r
S="-m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
timeout 220 python $S --output $OUT/r/structured_new.json > $OUT/r/structured_new.txt 2>&1; tail -1 $OUT/r/structured_new.txt
PYTHONPATH=$PWD/.devrun/old/python:$PYTHONPATH timeout 220 python $S --output $OUT/r/structured_old.json > $OUT/r/structured_old.txt 2>&1; tail -1 $OUT/r/structured_old.txt
python benchmarks/results/issue11/fast_path_h200/mask_inprocess.py /root/smollm.gguf 64 64 6 $OUT/r/inproc_new_bs64.json > $OUT/r/inproc_new_bs64.txt 2>&1; grep -E '^ "|ms_median|vs_U' $OUT/r/inproc_new_bs64.txt | tr -d '\n'; echo
PYTHONPATH=$PWD/.devrun/old/python:$PYTHONPATH python benchmarks/results/issue11/fast_path_h200/mask_inprocess.py /root/smollm.gguf 64 64 6 $OUT/r/inproc_old_bs64.json > $OUT/r/inproc_old_bs64.txt 2>&1; grep -E '^ "|ms_median|vs_U' $OUT/r/inproc_old_bs64.txt | tr -d '\n'; echo
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py -k "structured or optimistic" > $OUT/r/pytest_gpu_structured.txt 2>&1; tail -2 $OUT/r/pytest_gpu_structured.txt
