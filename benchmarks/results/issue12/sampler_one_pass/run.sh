source .devrun/env.sh > /dev/null
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p $OUT/h
T=$PWD/.devrun/tok
NEW=$PWD/python:$PYTHONPATH; OLD=$PWD/.devrun/old/python:$PYTHONPATH
timeout 120 python -m pytest -q -m gpu tests/test_logprob_kernels.py tests/test_sampler.py 2>&1 | tail -3
ov() { tag=$1; shift; timeout 100 python -m radixlm.bench.overlap --load-format dummy --dtype bfloat16 "$@" --output $OUT/h/$tag.json 2>&1 | grep -E "^overlap|Error|us  x|GPU time" | grep -v -E "_kernel |nvjet|gemv" | tail -14; }
Q="--model-path benchmarks/configs/qwen3-0.6b --input-len 512"
E="--model-path benchmarks/configs/llama-3.1-8b --batch-size 1 --input-len 1024 --steps 64"
PYTHONPATH=$NEW ov overlap_qwen3_bs64_new_1 $Q --batch-size 64 --kernel-table 40
PYTHONPATH=$OLD ov overlap_qwen3_bs64_old_1 $Q --batch-size 64
PYTHONPATH=$NEW ov overlap_qwen3_bs64_new_2 $Q --batch-size 64
PYTHONPATH=$OLD ov overlap_qwen3_bs64_old_2 $Q --batch-size 64
PYTHONPATH=$NEW ov overlap_qwen3_bs1_new $Q --batch-size 1
PYTHONPATH=$OLD ov overlap_qwen3_bs1_old $Q --batch-size 1
PYTHONPATH=$NEW ov overlap_8b_bs1_new $E
PYTHONPATH=$OLD ov overlap_8b_bs1_old $E
H="-m radixlm.bench.headline --model-path benchmarks/configs/llama-3.2-1b --load-format dummy --dtype bfloat16 --tokenizer-path $T"
PYTHONPATH=$NEW timeout 100 python3 $H --output $OUT/h/headline_new.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
PYTHONPATH=$OLD timeout 100 python3 $H --output $OUT/h/headline_old.json 2>&1 | grep "^headline\|Error\|Traceback" | tail -2
B="-m radixlm.bench.one_batch --load-format dummy --dtype bfloat16 --model-path benchmarks/configs/llama-3.2-1b --batch-size 256 --input-len 512 --output-len 32"
PYTHONPATH=$NEW timeout 100 python3 $B --output $OUT/h/one_batch_1b_bs256_new.json 2>&1 | grep -v Warn | tail -1
PYTHONPATH=$OLD timeout 100 python3 $B --output $OUT/h/one_batch_1b_bs256_old.json 2>&1 | grep -v Warn | tail -1
serve() {
  python3 -m radixlm.cli serve --model-path benchmarks/configs/llama-3.2-1b --load-format dummy \
      --dtype bfloat16 --tokenizer-path $T --port 30000 > /tmp/serve_$1.log 2>&1 &
  for i in $(seq 90); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; sleep 1; done
  timeout 60 python3 -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --tokenizer $T --num-prompts 100 \
      --max-input-len 1024 --max-output-len 256 --backend radixlm --request-rate 16 --output $OUT/h/serving_$1.json 2>&1 | tail -1
  pkill -TERM -f "radixlm.cli serve" ; sleep 4; pkill -KILL -f "radixlm.cli serve"; sleep 1
}
PYTHONPATH=$NEW serve new
PYTHONPATH=$OLD serve old
tar -czf $OUT/h.tgz -C $OUT h && rm -rf $OUT/h
echo "elapsed $SECONDS"
