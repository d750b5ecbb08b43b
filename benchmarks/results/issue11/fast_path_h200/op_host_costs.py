import time, torch
from radixlm.utils.device import to_host_async
dev = torch.device("cuda")
big = torch.randn(8192, 8192, device=dev)
def busy():
    for _ in range(3): big @ big
torch.cuda.synchronize()
t = time.perf_counter(); busy(); torch.cuda.synchronize(); print("busy() GPU ms", (time.perf_counter() - t) * 1e3)
for B in (1, 8, 64):
    x = torch.randn(B, 49152, device=dev)
    for name, fn in [("topk16", lambda: torch.topk(x, 16, dim=-1)),
                     ("argmax", lambda: torch.argmax(x, dim=-1)),
                     ("stack_double", lambda: torch.stack([x[:, :16].double(), x[:, :16].double()])),
                     ("to_host_async", lambda: to_host_async(x[:, :16].double(), x[:, 0]))]:
        for rep in range(3):
            torch.cuda.synchronize(); busy()
            t = time.perf_counter(); fn(); host = (time.perf_counter() - t) * 1e3
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50): fn()
        torch.cuda.synchronize(); per = (time.perf_counter() - t) / 50 * 1e3
        print(f"B={B} {name}: host ms behind busy GPU {host:.3f}; per call (synced loop) {per:.4f}")
