"""Chat and copy prompts of bench spec, greedy, float32 (and bf16): NGRAM k16 pipelined vs waits vs off."""
import json, os, sys
from radixlm.bench.spec import CHAT, COPY
from radixlm.entrypoints.engine import Engine
dtype = sys.argv[1]
out = {}
for name, spec, pipe in (("off", None, True), ("waits", "NGRAM", False), ("pipelined", "NGRAM", True)):
    if pipe:
        os.environ.pop("RADIXLM_DISABLE_SPEC_PIPELINE", None)
    else:
        os.environ["RADIXLM_DISABLE_SPEC_PIPELINE"] = "1"
    e = Engine(model_path="/root/smollm.gguf", dtype=dtype, log_level="warning", speculative_algorithm=spec, speculative_num_draft_tokens=16)
    outs = []
    for p in COPY + CHAT:
        o = e.generate(e.apply_chat_template([{"role": "user", "content": p}]), {"max_new_tokens": 256, "temperature": 0})
        outs.append(o["output_ids"])
    out[name] = outs
    st = e.get_stats()
    out[name + "_pipelined_steps"] = st.spec_pipelined_steps
    e.shutdown()
for n in ("waits", "pipelined"):
    print(dtype, n, "identical to off:", [a == b for a, b in zip(out["off"], out[n])], "pipelined steps", out[n + "_pipelined_steps"])
json.dump(out, open(os.path.join(os.environ["OUT"], f"fp32chat_{dtype}.json"), "w"))
