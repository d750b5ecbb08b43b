"""FP8 routed experts: `--quantization fp8` on a full-precision MoE checkpoint, or an FP8 one
(DeepSeek-V3 and Qwen3-*-FP8 with 128x128 block scales, per-tensor FP8, compressed-tensors FP8).

After loading, each stack holds float8_e4m3fn values and one fp32 scale per (expert, output row)
or per (expert, block):

    w13_weight [E, 2I/tp, H] fp8    w13_weight_scale [E, 2I/tp]  or [E, 2I/tp/bn, ceil(H/bk)]
    w2_weight  [E, H, I/tp]  fp8    w2_weight_scale  [E, H]      or [E, ceil(H/bn), ceil(I/tp/bk)]

How each source gets there:
  online       the checkpoint's full-precision experts, quantized once loaded, per row;
  per-tensor   one scale per expert matrix, repeated over its rows (exact);
  channel      one scale per row, as stored ([rows, 1]);
  block        as stored (HF calls it weight_scale_inv). The gate and up halves of w13 must each
               be whole blocks, so moe_intermediate_size / tp must be a multiple of the block.
Static `input_scale` tensors are read and not used: where the kernels quantize activations
(W8A8, layers/moe/experts.py), they scale each row's groups of 128 inputs at run time.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.moe.experts import Fp8ExpertScales
from radixlm.layers.moe.layer import SCALE, WEIGHT, FusedMoE
from radixlm.layers.quantization.fp8_kernels import FP8_DTYPE, quantize_fp8_per_channel
from radixlm.layers.quantization.spec import FP8_MAX, QuantSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Fp8Experts(FusedMoE):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 tp: TPGroup, spec: QuantSpec):
        super().__init__(num_experts, hidden_size, intermediate_size, tp,
                         weight_dtype=None if spec.online else FP8_DTYPE)
        self.spec = spec
        self.block = spec.fp8_block
        self._scales: Fp8ExpertScales | None = None
        if spec.online:
            return
        e, h, shard = num_experts, hidden_size, self.shard
        if spec.fp8_scales == "tensor":
            shapes = (e, 2), (e, 1)
        elif spec.fp8_scales == "channel":
            shapes = (e, 2 * shard), (e, h)
        else:
            bn, bk = spec.fp8_block  # type: ignore[misc]
            if tp.size == 1 and shard % bn:
                raise ValueError(
                    f"--model-path: moe_intermediate_size {intermediate_size} is not a whole "
                    f"number of the checkpoint's {bn}-row FP8 scale blocks (the gate and up "
                    f"halves of the stacked experts must each be whole blocks)")
            if tp.size > 1 and (shard % bn or shard % bk):
                raise ValueError(
                    f"--tp-size {tp.size}: moe_intermediate_size {intermediate_size} gives "
                    f"{shard} rows per rank, not a whole number of the checkpoint's "
                    f"{bn}x{bk} FP8 scale blocks")
            shapes = (e, 2 * shard // bn, _cdiv(h, bk)), (e, _cdiv(h, bn), _cdiv(shard, bk))
        self.w13_weight_scale = self._stacked(shapes[0], torch.float32)
        self.w2_weight_scale = self._stacked(shapes[1], torch.float32)
        if spec.static_input_scales:
            self.w13_input_scale = self._stacked((e, 2), torch.float32)
            self.w2_input_scale = self._stacked((e, 1), torch.float32)

    def _kinds(self) -> tuple[int, ...]:
        return (WEIGHT,) if self.spec.online else (WEIGHT, SCALE)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard: tuple[int, int | None]) -> None:
        if param is self.w13_weight or param is self.w2_weight:
            super().weight_loader(param, loaded, shard)
            return
        expert, part = shard
        self._check_expert(expert)
        down = part is None
        where = f"expert {expert} {'down' if down else ('gate', 'up')[part]} scale"
        if param is getattr(self, "w13_input_scale", None) or (
                param is getattr(self, "w2_input_scale", None)):
            param.data[expert, 0 if down else part] = loaded.reshape(())
            return
        kind, full = self.spec.fp8_scales, self.shard * self.tp.size
        if kind == "tensor":
            if loaded.numel() != 1:
                raise ValueError(f"{where}: {tuple(loaded.shape)}, expected one per-tensor "
                                 f"scale")
            param.data[expert, 0 if down else part] = loaded.reshape(())
        elif kind == "channel":
            rows = loaded.reshape(-1)
            if rows.numel() != (self.hidden_size if down else full):
                raise ValueError(f"{where}: {tuple(loaded.shape)} scales, expected one per "
                                 f"output row")
            if down:
                param.data[expert].copy_(rows)
            else:
                param.data[expert, part * self.shard:(part + 1) * self.shard].copy_(
                    rows[self._rows()])
        else:
            bn, bk = self.block  # type: ignore[misc]
            h = self.hidden_size
            want = (_cdiv(h, bn), _cdiv(full, bk)) if down else (_cdiv(full, bn), _cdiv(h, bk))
            if tuple(loaded.shape) != want:
                raise ValueError(f"{where}: {tuple(loaded.shape)} blocks, expected {want}")
            if down:            # this rank's input columns, in whole blocks
                first, count = self.tp.rank * self.shard // bk, _cdiv(self.shard, bk)
                param.data[expert].copy_(loaded[:, first:first + count])
            else:               # this rank's output rows, in whole blocks
                first, count = self.tp.rank * self.shard // bn, self.shard // bn
                param.data[expert, part * count:(part + 1) * count].copy_(
                    loaded[first:first + count])
        self._filled.add((expert, 2 if down else part, SCALE))

    @torch.no_grad()
    def process_weights_after_loading(self) -> None:
        if self.spec.online:
            w13, s13 = quantize_experts(self.w13_weight.data)
            w2, s2 = quantize_experts(self.w2_weight.data)
        else:
            w13, w2 = self.w13_weight.data, self.w2_weight.data
            s13 = self.w13_weight_scale.data.float()
            s2 = self.w2_weight_scale.data.float()
            if self.spec.fp8_scales == "tensor":     # one per matrix -> one per row (exact)
                s13 = s13.repeat_interleave(self.shard, dim=1)
                s2 = s2.expand(-1, self.hidden_size)
            for name in ("w13_input_scale", "w2_input_scale"):
                if hasattr(self, name):
                    delattr(self, name)
        self.w13_weight = nn.Parameter(w13.contiguous(), requires_grad=False)
        self.w2_weight = nn.Parameter(w2.contiguous(), requires_grad=False)
        self.w13_weight_scale = nn.Parameter(s13.contiguous(), requires_grad=False)
        self.w2_weight_scale = nn.Parameter(s2.contiguous(), requires_grad=False)
        self._scales = Fp8ExpertScales(self.w13_weight_scale, self.w2_weight_scale, self.block)

    def fp8_scales(self) -> Fp8ExpertScales:
        if self._scales is None:
            raise RuntimeError("FP8 experts used before process_weights_after_loading")
        return self._scales


def quantize_experts(w: torch.Tensor, block: tuple[int, int] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] full precision -> (FP8 [E, N, K], fp32 scales): one per row, [E, N], or one
    per (bn, bk) block, [E, ceil(N/bn), ceil(K/bk)]. One expert at a time (a float32 copy of a
    whole layer's experts would be 4x its bf16 size). Online quantization uses rows; the
    benchmarks also make block-scaled stacks, as FP8 checkpoints ship them."""
    q = torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device)
    if block is None:
        scale = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
        for e in range(w.shape[0]):
            q[e], scale[e] = quantize_fp8_per_channel(w[e])
        return q, scale
    (n, k), (bn, bk) = w.shape[1:], block
    nb, kb = _cdiv(n, bn), _cdiv(k, bk)
    scale = torch.empty((w.shape[0], nb, kb), dtype=torch.float32, device=w.device)
    for e in range(w.shape[0]):
        padded = torch.zeros(nb * bn, kb * bk, device=w.device)
        padded[:n, :k] = w[e].float()
        tiles = padded.view(nb, bn, kb, bk)
        scale[e] = tiles.abs().amax((1, 3)).clamp(min=1e-12) / FP8_MAX
        values = (tiles / scale[e][:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
        q[e] = values.view(nb * bn, kb * bk)[:n, :k].to(FP8_DTYPE)
    return q, scale
