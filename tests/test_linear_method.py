"""The linear-method hook (layers/linear.py): the unquantized method is exactly F.linear, a
custom method plugged into a parallel layer is the one that runs, and checkpoint loading of the
fused layers still puts every shard where it belongs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.linear import (UNQUANTIZED, ColumnParallelLinear, LinearMethod,
                                   MergedColumnParallelLinear, QKVParallelLinear,
                                   RowParallelLinear, UnquantizedLinearMethod)


class ScaledLinearMethod(UnquantizedLinearMethod):
    """A toy method: same weights, output times `scale`; counts its calls."""

    def __init__(self, scale: float):
        self.scale = scale
        self.created: list[tuple[int, list[int]]] = []
        self.calls = 0

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, bias,
                       weight_loader, bias_loader=None):
        self.created.append((input_size_per_partition, list(output_partition_sizes)))
        super().create_weights(layer, input_size_per_partition, output_partition_sizes, bias,
                               weight_loader, bias_loader)

    def apply(self, layer, x, bias):
        self.calls += 1
        return super().apply(layer, x, bias) * self.scale


def _fill(layer: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def test_unquantized_method_is_f_linear():
    layer = nn.Module()
    loader = lambda p, t: p.data.copy_(t)   # noqa: E731
    UNQUANTIZED.create_weights(layer, 6, [3, 5], True, loader)
    assert layer.weight.shape == (8, 6) and layer.bias.shape == (8,)
    assert layer.weight.weight_loader is loader and layer.bias.weight_loader is loader
    _fill(layer)
    x = torch.randn(4, 6)
    torch.testing.assert_close(UNQUANTIZED.apply(layer, x, layer.bias),
                               F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    torch.testing.assert_close(UNQUANTIZED.apply(layer, x, None), F.linear(x, layer.weight),
                               rtol=0, atol=0)
    no_bias = nn.Module()
    UNQUANTIZED.create_weights(no_bias, 6, [8], False, loader)
    assert no_bias.bias is None


@pytest.mark.parametrize("make", [
    lambda m: ColumnParallelLinear(6, [8], bias=True, linear_method=m),
    lambda m: MergedColumnParallelLinear(6, [4, 4], bias=True, linear_method=m),
    lambda m: QKVParallelLinear(6, 2, num_heads=4, num_kv_heads=2, bias=True, linear_method=m),
], ids=["column", "merged", "qkv"])
def test_layers_default_to_unquantized_and_match_f_linear(make):
    layer = make(None)
    assert layer.linear_method is UNQUANTIZED
    _fill(layer)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_custom_method_is_used_by_column_layers():
    method = ScaledLinearMethod(2.0)
    qkv = QKVParallelLinear(6, 2, num_heads=4, num_kv_heads=2, bias=True, linear_method=method)
    assert method.created == [(6, [8, 4, 4])]   # per-part sizes reach the method
    _fill(qkv)
    x = torch.randn(3, 6)
    torch.testing.assert_close(qkv(x), 2.0 * F.linear(x, qkv.weight, qkv.bias))
    assert method.calls == 1


def test_custom_method_in_row_layer_bias_added_after():
    """Row-parallel: the method computes the partial product without the bias; the layer adds
    the bias after the all-reduce (so a scaling method does not scale the bias)."""
    method = ScaledLinearMethod(3.0)
    row = RowParallelLinear(8, 5, bias=True, linear_method=method)
    assert method.created == [(8, [5])]
    _fill(row)
    x = torch.randn(2, 8)
    torch.testing.assert_close(row(x), 3.0 * F.linear(x, row.weight) + row.bias)
    assert method.calls == 1


class _NotImplemented(LinearMethod):
    pass


def test_base_method_must_be_implemented():
    with pytest.raises(NotImplementedError):
        ColumnParallelLinear(4, [4], linear_method=_NotImplemented())


@pytest.mark.parametrize("rank", [0, 1])
def test_fused_weight_loading_through_the_hook(rank):
    """Rank `rank` of 2: qkv_proj and gate_up_proj hold their half of each part, in order,
    and the row-parallel layer its half of the input columns with the whole bias. Loading
    only (no collectives run)."""
    tp = TPGroup(rank=rank, size=2)
    method = ScaledLinearMethod(1.0)
    hidden, head_dim, heads, kv_heads, inter = 6, 2, 4, 2, 10
    q = torch.randn(heads * head_dim, hidden)
    k = torch.randn(kv_heads * head_dim, hidden)
    v = torch.randn(kv_heads * head_dim, hidden)
    qb, kb, vb = torch.randn(len(q)), torch.randn(len(k)), torch.randn(len(v))
    qkv = QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias=True, tp=tp,
                            linear_method=method)
    for shard, w, b in (("q", q, qb), ("k", k, kb), ("v", v, vb)):
        qkv.weight.weight_loader(qkv.weight, w, shard)
        qkv.bias.weight_loader(qkv.bias, b, shard)

    def half(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        n = t.shape[dim] // 2
        return t.narrow(dim, rank * n, n)

    torch.testing.assert_close(qkv.weight, torch.cat([half(q), half(k), half(v)]))
    torch.testing.assert_close(qkv.bias, torch.cat([half(qb), half(kb), half(vb)]))
    assert (qkv.q_size, qkv.kv_size) == (heads * head_dim // 2, kv_heads * head_dim // 2)

    gate, up = torch.randn(inter, hidden), torch.randn(inter, hidden)
    gate_up = MergedColumnParallelLinear(hidden, [inter, inter], tp=tp, linear_method=method)
    gate_up.weight.weight_loader(gate_up.weight, gate, 0)
    gate_up.weight.weight_loader(gate_up.weight, up, 1)
    torch.testing.assert_close(gate_up.weight, torch.cat([half(gate), half(up)]))

    down, down_b = torch.randn(hidden, inter), torch.randn(hidden)
    row = RowParallelLinear(inter, hidden, bias=True, tp=tp, linear_method=method)
    row.weight.weight_loader(row.weight, down)
    row.bias.weight_loader(row.bias, down_b)
    torch.testing.assert_close(row.weight, half(down, dim=1))
    torch.testing.assert_close(row.bias, down_b)
