source .devrun/env.sh
M=/root/smollm.gguf
f() { grep -E "^(copy|chat):" ; }
n=0
for v in new prev new prev; do
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.devrun/prev/python; else PP=/tmp/site:$PWD/python; fi
  n=$((n+1))
  echo "== spec k16 $v ($n)"; PYTHONPATH=$PP timeout 150 python3 -m radixlm.bench.spec --model-path $M --num-draft-tokens 16 --output $OUT/spec_${v}_k16_$n.json 2>&1 | f
done
for v in new prev; do
  if [ $v = prev ]; then PP=/tmp/site:$PWD/.devrun/prev/python:$PWD/tests; else PP=/tmp/site:$PWD/python:$PWD/tests; fi
  echo "== host phases $v"; MP=$M PYTHONPATH=$PP timeout 120 python3 .devrun/host_phases.py cuda ngram 2>&1 | tail -16 | tee $OUT/host_phases_$v.txt
done
