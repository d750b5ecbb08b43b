"""Test-side writers of quantized checkpoint tensors (AWQ, GPTQ, FP8), written from the formats'
descriptions with plain loops, independently of the package's vectorised repacking, so that a
layout mistake in one is not repeated in the other."""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def rtn_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (values [K, N] 0..15, zeros [G, N] 1..15, scales [G, N]) by plain
    round-to-nearest per group of inputs (K a multiple of `group`)."""
    n, k = w.shape
    wt = w.t().reshape(k // group, group, n)
    lo, hi = wt.amin(1), wt.amax(1)
    scales = (hi - lo).clamp(min=1e-6) / 14.0
    zeros = torch.round(-lo / scales).clamp(1, 15)
    vals = torch.round(wt / scales[:, None] + zeros[:, None]).clamp(0, 15)
    return vals.reshape(k, n).long(), zeros.long(), scales


def int4_reference(vals, zeros, scales, group: int) -> torch.Tensor:
    """The weight [N, K] those values stand for."""
    k = vals.shape[0]
    g = torch.arange(k) // group
    return ((vals - zeros[g]).float() * scales[g]).t()


def pack_columns(vals: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[R, 8C] -> [R, C] int32: nibble i of word c holds column 8c + order[i]."""
    r, c8 = vals.shape
    out = torch.zeros(r, c8 // 8, dtype=torch.int64)
    for c in range(c8 // 8):
        for i in range(8):
            out[:, c] |= vals[:, 8 * c + order[i]].long() << (4 * i)
    return _to_int32(out)


def pack_rows(vals: torch.Tensor) -> torch.Tensor:
    """[8R, C] -> [R, C] int32: nibble j of word r holds row 8r + j."""
    r8, c = vals.shape
    out = torch.zeros(r8 // 8, c, dtype=torch.int64)
    for r in range(r8 // 8):
        for j in range(8):
            out[r] |= vals[8 * r + j].long() << (4 * j)
    return _to_int32(out)


def awq_tensors(vals, zeros, scales) -> dict[str, torch.Tensor]:
    return {"qweight": pack_columns(vals, AWQ_ORDER), "qzeros": pack_columns(zeros, AWQ_ORDER),
            "scales": scales.half()}


def gptq_tensors(vals, zeros, scales, group: int, v1: bool = True) -> dict[str, torch.Tensor]:
    k = vals.shape[0]
    return {"qweight": pack_rows(vals), "qzeros": pack_columns(zeros - 1 if v1 else zeros),
            "scales": scales.half(), "g_idx": (torch.arange(k) // group).to(torch.int32)}


def fp8_tensors(w: torch.Tensor, scales: str, block: tuple[int, int] = (16, 16)
                ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(checkpoint tensors, the weight they stand for). scales: "tensor" (one scale,
    weight_scale), "channel" ([N, 1] weight_scale), "block" (weight_scale_inv, HF's name)."""
    n, k = w.shape
    if scales == "tensor":
        s = w.abs().max() / 448.0
        q = (w / s).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": s.reshape(())}, q.float() * s
    if scales == "channel":
        s = w.abs().amax(1, keepdim=True) / 448.0
        q = (w / s).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": s}, q.float() * s
    bn, bk = block
    s = torch.empty(-(-n // bn), -(-k // bk))
    full = torch.empty(n, k)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            s[i, j] = tile.abs().max() / 448.0
            full[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = s[i, j]
    q = (w / full).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": s}, q.float() * full


QUANT_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "desc_act": False, "sym": False},
    "fp8-tensor": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8-block": {"quant_method": "fp8", "activation_scheme": "dynamic",
                  "weight_block_size": [16, 16]},
    "fp8-channel": {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        "targets": ["Linear"]}}, "ignore": ["lm_head", "re:.*mlp.gate$"]},
}


def checkpoint_tensors(fmt: str, w: torch.Tensor, group: int
                       ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the tensors a checkpoint of `fmt` stores for weight w [N, K], the weight they mean)."""
    if fmt.startswith("fp8"):
        return fp8_tensors(w, fmt.split("-")[1])
    vals, zeros, scales = rtn_int4(w, group)
    ref = int4_reference(vals, zeros, scales.half().float(), group)
    if fmt == "awq":
        return awq_tensors(vals, zeros, scales), ref
    return gptq_tensors(vals, zeros, scales, group), ref


def write_quantized_checkpoint(state: dict[str, torch.Tensor], config: dict, path, fmt: str,
                               group: int = 32) -> dict[str, torch.Tensor]:
    """Write `state` (an HF state dict) as a `fmt` checkpoint in `path` (config.json with its
    quantization_config, model.safetensors); every *proj.weight (and MLA's
    kv_a_proj_with_mqa) is quantized, routed experts' included, MoE routers (mlp.gate) not.
    Returns the state dict of the weights the checkpoint stands for (to load into a reference
    model)."""
    import json
    import os

    from safetensors.torch import save_file
    out, reference = {}, {}
    for name, p in state.items():
        if not name.endswith(("proj.weight", "proj_with_mqa.weight")):
            out[name] = reference[name] = p.contiguous()
            continue
        tensors, ref = checkpoint_tensors(fmt, p.float(), group)
        reference[name] = ref
        prefix = name.removesuffix("weight")
        out.update({prefix + k: v.contiguous() for k, v in tensors.items()})
    os.makedirs(path, exist_ok=True)
    qc = dict(QUANT_CONFIGS[fmt])
    if fmt in ("awq", "gptq"):
        qc["group_size"] = group
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**config, "quantization_config": qc}, f)
    save_file(out, os.path.join(path, "model.safetensors"))
    return reference
