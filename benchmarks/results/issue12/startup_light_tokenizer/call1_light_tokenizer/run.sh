source .devrun/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import transformers, tokenizers, torch; print(transformers.__version__, tokenizers.__version__, torch.__version__)"
SA="--model-path benchmarks/configs/llama-3.1-8b-shape-smollm2-vocab --load-format dummy --dtype bfloat16 --tokenizer-path $PWD/.tok --log-level warning"
i=0
for v in new new prev new prev new prev; do
  i=$((i+1))
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.prev/python; else PP=/tmp/site:$PWD/python; fi
  PYTHONPATH=$PP timeout 200 python3 -m radixlm.bench.startup --runs 1 --output $OUT/startup_${i}_${v}.json --server-args $SA 2>&1 | grep "run 1" | sed "s/^/$v: /"
done
python3 -X importtime -c "
from radixlm.distributed.parallel_state import init_tensor_parallel
from radixlm.mem_cache.hiradix_cache import HiCacheConfig
from radixlm.model_executor.light_tokenizer import load_ids_tokenizer
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.scheduler.scheduler import Scheduler" 2> $OUT/importtime.txt
sort -t'|' -k2 -n $OUT/importtime.txt | tail -25
