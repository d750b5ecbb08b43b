"""Experiment: persistent one-row FP8 GEMV with the next tile prefetched into registers."""
import sys, json, os
import torch, triton, triton.language as tl
from radixlm.layers.kernels.gemv_kernels import load_k_tile
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait


@triton.jit
def _tile_ptrs(w_ptr, b, N, stride_wn, offs_r, offs_k, k0, BLOCK_N: tl.constexpr):
    rows = tl.minimum(b * BLOCK_N + offs_r, N - 1)
    return w_ptr + rows[:, None].to(tl.int64) * stride_wn + k0 + offs_k[None, :]


@triton.jit
def _fp8_gemv_persistent(x_ptr, w_ptr, s_ptr, y_ptr, N, stride_wn, NUM_BLOCKS,
                         K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    T: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    # contiguous share of row blocks
    per = NUM_BLOCKS // P
    extra = NUM_BLOCKS % P
    b0 = pid * per + tl.minimum(pid, extra)
    b1 = b0 + per + (pid < extra).to(tl.int32)
    offs_r = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w = load_k_tile(_tile_ptrs(w_ptr, b0, N, stride_wn, offs_r, offs_k, 0, BLOCK_N), 0,
                    offs_k[None, :], K, BLOCK_K)
    pdl_wait(PDL)
    if T == 1:
        x = load_k_tile(x_ptr + offs_k, 0, offs_k, K, BLOCK_K).to(tl.float32)
    for b in range(b0, b1):
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kk in tl.static_range(T):
            if kk + 1 < T:
                nb = b
                nk = (kk + 1) * BLOCK_K
            else:
                nb = b + 1
                nk = 0
            more = tl.full((BLOCK_N, BLOCK_K), nb, tl.int32) < b1
            p = _tile_ptrs(w_ptr, nb, N, stride_wn, offs_r, offs_k, nk, BLOCK_N)
            if K % BLOCK_K == 0:
                w_next = tl.load(p, mask=more, other=0.0)
            else:
                w_next = tl.load(p, mask=more & (nk + offs_k[None, :] < K), other=0.0)
            if T > 1:
                x = load_k_tile(x_ptr + kk * BLOCK_K + offs_k, kk * BLOCK_K, offs_k, K,
                                BLOCK_K).to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
            w = w_next
        rows = b * BLOCK_N + offs_r
        y = tl.sum(acc, axis=1) * tl.load(s_ptr + tl.minimum(rows, N - 1))
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)


def fp8_gemv_persistent(x, w, scale, block_n=4, block_k=4096, programs=264, num_warps=4):
    n, k = w.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    nb = triton.cdiv(n, block_n)
    programs = min(programs, nb)
    _fp8_gemv_persistent[(programs,)](x, w, scale, y, n, w.stride(0), nb, K=k, BLOCK_N=block_n,
                                      BLOCK_K=block_k, num_warps=num_warps, num_stages=1,
                                      **pdl_kwargs(x.device, 1))
    return y


def check_cpu():
    from radixlm.layers.quantization.fp8_kernels import quantize_fp8_per_channel, dequantize_fp8
    for n, k, bn, bk, p in ((37, 64, 4, 32, 3), (40, 96, 8, 32, 4), (5, 64, 2, 64, 7)):
        w = torch.randn(n, k)
        q, s = quantize_fp8_per_channel(w)
        x = torch.randn(1, k)
        ref = x @ dequantize_fp8(q, s, None, torch.float32).t()
        got = fp8_gemv_persistent(x, q, s, bn, bk, p)
        print(n, k, (got - ref).abs().max().item())


def bench():
    from radixlm.bench.gemv import copies_past_l2, timed_over_copies
    from radixlm.bench.one_batch import copy_bandwidth
    from radixlm.layers.quantization.fp8_kernels import quantize_fp8_per_channel, dequantize_fp8
    from radixlm.layers.quantization.fp8_gemv import fp8_gemv
    bw = copy_bandwidth(torch.device("cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    out = {}
    for name, (n, k) in shapes.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5)
        q, s = quantize_fp8_per_channel(w)
        ref = x.float() @ dequantize_fp8(q, s, None, torch.float32).t()
        nbytes = q.numel() + s.numel() * 4
        copies = copies_past_l2(lambda: (q.clone(), s.clone()), nbytes)
        base = timed_over_copies(lambda c: fp8_gemv(x, c[0], c[1], None), copies)
        rows = []
        bks = (4096,) if k % 4096 == 0 else (2048, 1024)
        for bn in (2, 4, 8):
            for bk in bks:
                for pps in (1, 2, 3, 4):
                    for nw in (4, 8):
                        try:
                            got = fp8_gemv_persistent(x, q, s, bn, bk, pps * sms, nw)
                            err = (got.float() - ref).abs().max().item()
                            if err > 0.02 * ref.abs().max().item():
                                print("WRONG", name, bn, bk, pps, nw, err); continue
                            us = timed_over_copies(lambda c: fp8_gemv_persistent(x, c[0], c[1], bn, bk, pps * sms, nw), copies)
                            rows.append(dict(bn=bn, bk=bk, pps=pps, nw=nw, us=us, of_bw=nbytes / (us * 1e-6) / bw))
                        except Exception as e:
                            print("ERR", name, bn, bk, pps, nw, type(e).__name__, str(e)[:80])
        rows.sort(key=lambda r: r["us"])
        print(f"{name}: current {base:.2f} us ({nbytes / (base * 1e-6) / bw:.0%}); best persistent", rows[:3], flush=True)
        out[name] = dict(current_us=base, current_of_bw=nbytes / (base * 1e-6) / bw, persistent=rows)
        del copies
        torch.cuda.empty_cache()
    json.dump(dict(copy_bw=bw, shapes=out), open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    check_cpu() if sys.argv[1] == "cpu" else bench()
