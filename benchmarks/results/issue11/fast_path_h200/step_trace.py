"""Per-step trace of the mask workload (U vs C) plus torch sync-debug warnings in C."""
import os, sys, time, json, collections, statistics, warnings, traceback
sys.argv = [sys.argv[0], sys.argv[1], sys.argv[2], "64", "0"]
os.environ["VARIANTS"] = "U,C"
src = open(os.path.join(os.path.dirname(__file__), "mask_inprocess.py")).read()
src = src[:src.index("variants = os.environ")]
exec(compile(src, "exp1_head", "exec"))
import torch

def trace(variant, sync_debug=False):
    kv.flush()
    args = dataclasses.replace(base, disable_optimistic_grammar=False)
    s = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda t: [], lambda m: None, tokenizer=tok)
    for i, ids in enumerate(prompts):
        s.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=params_for(variant, i)))
    while any(r.grammar_future is not None and not r.grammar_future.done() for r in s.waiting):
        time.sleep(0.01)
    steps = []
    caught = collections.Counter()
    sync()
    if sync_debug and cuda:
        torch.cuda.set_sync_debug_mode(1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        while s.has_work:
            before = dict(acc)
            pend = s.pending
            a = time.perf_counter(); s.step(); d = time.perf_counter() - a
            delta = {k: round(1e3 * (v - before.get(k, 0.0)), 3) for k, v in acc.items() if v - before.get(k, 0.0) > 2e-4}
            b = s.pending.batch if s.pending is not None else None
            steps.append((round(d * 1e3, 3), (b.forward_mode.name if hasattr(b.forward_mode, "name") else str(b.forward_mode)) if b else None, b.batch_size if b else 0, s.grammar_rejections, delta))
        for x in w:
            if "synchroniz" in str(x.message).lower():
                stack = "".join(l for l in traceback.format_list(traceback.extract_stack()) if "radixlm" in l)
                caught[(str(x.message)[:80], x.filename, x.lineno)] += 1
    cuda and torch.cuda.set_sync_debug_mode(0)
    sync()
    return steps, caught

for v in ["U", "C"]:
    trace(v)
for rep in range(2):
    for v in ["U", "C"]:
        steps, _ = trace(v)
        ds = [x[0] for x in steps]
        med = statistics.median(ds)
        print(f"rep {rep} {v}: total {sum(ds):.1f} ms, {len(ds)} steps, median {med:.3f}")
        for k, x in enumerate(steps):
            if k < 3 or x[0] > 3 * med:
                print(f"   step {k}: {x[0]} ms mode={x[1]} bs={x[2]} rej={x[3]} {json.dumps(x[4])}")
steps, caught = trace("C", sync_debug=True)
print("sync warnings in C:", sum(caught.values()))
for k, n in caught.most_common(20):
    print(n, k)
