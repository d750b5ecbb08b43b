# The headline request under the server's profiler; kernel table and prefill batch shapes from the trace.
import argparse, collections, glob, gzip, json, os, sys
import torch
from radixlm.bench.headline import generate, start_server
from radixlm.utils.server_process import stop_server

tag = os.environ.get("TAG", "a")
out = os.environ.get("OUT", "/tmp/hp")
os.makedirs(out, exist_ok=True)
ns = argparse.Namespace(model_path="benchmarks/configs/llama-3.2-1b", load_format="dummy", dtype="bfloat16",
                        tokenizer_path=os.environ["RADIXLM_TEST_TOKENIZER_DIR"], batch_size=256,
                        server_args=sys.argv[1:], startup_timeout=600)
proc, url = start_server(ns)
try:
    prompts = torch.randint(0, 32000, (256, 4096), generator=torch.Generator().manual_seed(0))
    generate(url, prompts[:8], 16)
    s, _ = generate(url, prompts, 16)
    print("e2e", s, flush=True)
    s, outs = generate(url, prompts, 16, profile_dir=out + "/trace")
    print("profiled", s, outs[-1], flush=True)
    import subprocess
    for rate in ("16", "inf"):
        subprocess.run([sys.executable, "-m", "radixlm.bench.serving", "--base-url", url, "--tokenizer",
                        os.environ["RADIXLM_TEST_TOKENIZER_DIR"], "--num-prompts", "200", "--max-input-len", "1024",
                        "--max-output-len", "256", "--backend", "radixlm", "--request-rate", rate,
                        "--output", f"{out}/serving_{tag}_{rate}.json"], timeout=240)
finally:
    stop_server(proc, timeout_s=60)
path = glob.glob(out + "/trace/*.json.gz")[0]
ev = json.load(gzip.open(path))["traceEvents"]
k = [e for e in ev if e.get("cat") == "kernel"]
by = collections.defaultdict(lambda: [0, 0.0])
grids = collections.Counter()
for e in k:
    by[e["name"][:90]][0] += 1
    by[e["name"][:90]][1] += e["dur"]
    if "_extend_kernel" in e["name"]:
        grids[str(e["args"].get("grid"))] += 1
tot = sum(v[1] for v in by.values())
print(tag, f"kernels {len(k)} total {tot/1e3:.1f} ms")
for n, (c, d) in sorted(by.items(), key=lambda x: -x[1][1])[:30]:
    print(f"{d/1e3:9.1f} ms {c:6d} {n}")
print("extend grids", grids.most_common(20))
json.dump(dict(total_ms=tot / 1e3, kernels=sorted(([n, c, d / 1e3] for n, (c, d) in by.items()), key=lambda x: -x[2])[:40],
               extend_grids=grids.most_common(40)), open(out + f"/headline_kernels_{tag}.json", "w"), indent=1)
os.remove(path)
