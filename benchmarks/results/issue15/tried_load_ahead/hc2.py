"""multi-turn, hicache on only, several env variants, same machine."""
import argparse
import json
import os
import sys

from radixlm.bench import hicache
SA = sys.argv[1]
ns = argparse.Namespace(server_args=SA, max_total_tokens=32768, hicache_ratio=4.0, num_users=32,
    num_turns=6, system_prompt_len=2048, question_len=64, output_len=32, num_docs=16, doc_len=4096,
    questions_per_doc=4, seed=0)
out = {}
for label, env in [("in_match", {"RADIXLM_HICACHE_LOAD_IN_MATCH": "1"}), ("ahead_p2", {}),
                   ("ahead_full", {"XP_PROGRAMS": "0"}), ("ahead_p8", {"XP_PROGRAMS": "8"}),
                   ("in_match2", {"RADIXLM_HICACHE_LOAD_IN_MATCH": "1"}), ("ahead_p2_2", {})]:
    for k in ("RADIXLM_HICACHE_LOAD_IN_MATCH", "XP_PROGRAMS"):
        os.environ.pop(k, None)
    os.environ.update(env)
    r = hicache.run_setting(ns, True, "multi-turn")
    out[label] = r
    print(f"{label:12s} wall {r['wall_s']:.2f} s  ttft med {r['ttft_median_s']*1e3:.0f} ms  "
          f"loaded {r['hicache_loaded_tokens']}  hit {r['cache_hit_rate']:.3f}", flush=True)
json.dump(out, open(os.path.join(os.environ["OUT"], "variants.json"), "w"), indent=1)
