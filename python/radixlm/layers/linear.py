"""Linear layers that know their tensor-parallel shard, and the linear-method hook.

Column-parallel layers split the output dimension across ranks, row-parallel layers split the
input dimension and all-reduce the result. Each parameter carries a `weight_loader` that takes a
full checkpoint tensor and copies this rank's shard into place (for fused layers, into the right
slice: q/k/v into qkv_proj, gate/up into gate_up_proj).

What tensors stand for the weight and how x is multiplied by them is a `LinearMethod`'s job, not
the layer's: the layer decides the shard shapes and the loaders, the method creates the
parameters and computes the product. Full precision is `UnquantizedLinearMethod` (F.linear); a
quantized format (FP8, INT4, ...) becomes one more LinearMethod subclass that every parallel
layer, and so every model, can take unchanged.

A method's parameters need not be shaped like the weight (packed 4-bit words, one scale per
group or block). Each parameter says how it maps onto the weight, so the layer's loaders can cut
this rank's shard out of any of them:
  `output_dim` / `input_dim`: the parameter's dimension that runs along the weight's output rows
      / input columns (defaults 0 / 1, as the weight; None: not split that way);
  `output_div` / `input_div`: how many rows / columns one element along that dimension stands
      for (8 for 4-bit values packed in int32, the group or block size for scales);
  `per_part`: one element per fused sub-matrix (a per-tensor scale of each of q, k and v).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.activation import silu_and_mul
from radixlm.layers.kernels import takes_one_row_gemv

# (param, full checkpoint tensor[, shard id]) -> copies this rank's part into param.
WeightLoader = Callable[..., None]


def _param(shape: tuple[int, ...], loader: WeightLoader, dtype: torch.dtype | None = None,
           **layout: object) -> nn.Parameter:
    """A frozen parameter with its loader and layout attributes (see the module docstring)."""
    p = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    p.weight_loader = loader  # type: ignore[attr-defined]
    for key, value in layout.items():
        setattr(p, key, value)
    return p


def register_bias(layer: nn.Module, size: int, bias: bool, loader: WeightLoader) -> None:
    """`layer.bias` in the compute dtype, split like the output rows (None without a bias):
    the same for every method, whatever it does with the weight."""
    layer.register_parameter("bias", _param((size,), loader) if bias else None)


def check_loaded_shape(param: torch.Tensor, loaded: torch.Tensor, dim: int | None,
                       full: int = 0, div: int = 1) -> None:
    """A checkpoint tensor must have the shape the model's config implies: `param`'s, except
    along the split dimension `dim`, where it holds all `full` rows (`div` to an element).
    A larger tensor would otherwise be cut to fit without a word (a config.json or an
    --json-model-override-args that does not match the weights), a [1] one broadcast."""
    expected = list(param.shape)
    if dim is not None:
        expected[dim] = -(-full // div)
    if list(loaded.shape) != expected:
        raise ValueError(f"the checkpoint's tensor has shape {tuple(loaded.shape)}, the model's "
                         f"config asks for {tuple(expected)}")


def _rows(size: int, start: int, div: int, what: str) -> tuple[int, int]:
    """(first element, count) of a parameter whose elements each cover `div` rows, for the
    rows [start, start + size) of the weight. A part must begin on an element boundary; its
    last element may be partial (a matrix whose size is not a multiple of the block)."""
    if start % div:
        raise ValueError(f"{what}: rows from {start} do not start on a {div}-row boundary of "
                         f"the quantized layout (tensor-parallel shard or fused part)")
    return start // div, -(-size // div)


class LinearMethod:
    """How a linear layer stores its weight and computes x W^T (+ b).

    Subclasses implement both methods; they keep no per-layer state themselves (whatever they
    create is registered on the layer), so one instance can serve every layer of a model.
    """

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], bias: bool,
                       weight_loader: WeightLoader,
                       bias_loader: WeightLoader | None = None) -> None:
        """Register `layer.weight` and `layer.bias` (None when `bias` is False), each with its
        `weight_loader` attribute. `output_partition_sizes` lists this rank's rows of each
        logical matrix fused into the layer (e.g. its q, k and v rows), for methods that keep a
        scale per fused part. `bias_loader` defaults to `weight_loader`."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T, plus `bias` when given. Row-parallel layers pass None and add their bias
        after the all-reduce themselves."""
        raise NotImplementedError

    def apply_gated(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of a [gate | up] layer without a bias, in one kernel, or None where
        the method has no such kernel for x (the caller then runs `apply` and the activation
        kernel). A subclass that changes what `apply` computes must override this too."""
        return None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once all of the layer's tensors are loaded: repack or quantize them into the
        layout `apply` reads. Nothing to do by default."""


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the compute dtype (the default dtype when created), one F.linear; on CUDA,
    one row of x (a batch-1 decode step) through the Triton GEMV where that was measured
    faster (layers/kernels/gemv_kernels.py)."""

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], bias: bool,
                       weight_loader: WeightLoader,
                       bias_loader: WeightLoader | None = None) -> None:
        out = sum(output_partition_sizes)
        layer.register_parameter("weight", _param((out, input_size_per_partition),
                                                  weight_loader))
        register_bias(layer, out, bias, bias_loader or weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        if takes_one_row_gemv(x):
            from radixlm.layers.kernels import gemv_kernels
            tiles = gemv_kernels.supports(x, layer.weight)
            if tiles is not None:
                return gemv_kernels.gemv(x, layer.weight, bias, tiles)
        return F.linear(x, layer.weight, bias)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        # At batch 1 the GEMV stores silu(gate) * up itself: one launch a layer fewer.
        if takes_one_row_gemv(x):
            from radixlm.layers.kernels import gemv_kernels
            tiles = gemv_kernels.gated_supports(x, layer.weight)
            if tiles is not None:
                return gemv_kernels.gemv(x, layer.weight, None, tiles, gated=True)
        return None


# Stateless, so every layer without an explicit method shares this one.
UNQUANTIZED = UnquantizedLinearMethod()

# The method of layers built without one. The loader sets it around model construction, as it
# sets the default dtype and device, so model classes need not pass it through every module.
_default_method: LinearMethod = UNQUANTIZED


@contextlib.contextmanager
def default_linear_method(method: LinearMethod | None) -> Iterator[None]:
    global _default_method
    old, _default_method = _default_method, method or UNQUANTIZED
    try:
        yield
    finally:
        _default_method = old


def current_linear_method() -> LinearMethod:
    """The method layers built now get by default (what the loader set for this model)."""
    return _default_method


class _QuantizableLinear(nn.Module):
    """What the parallel linear layers share: their method, and its post-loading step."""

    linear_method: LinearMethod

    def _set_method(self, method: LinearMethod | None) -> None:
        self.linear_method = method or _default_method

    def process_weights_after_loading(self) -> None:
        self.linear_method.process_weights_after_loading(self)


class ColumnParallelLinear(_QuantizableLinear):
    """y = x W^T (+ b) with W's output rows split across ranks; each rank keeps its slice.

    `output_sizes` lists the logical sub-matrices fused into this layer (one entry when unfused);
    each is sharded separately so a rank holds [its part of A, its part of B, ...].
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 tp: TPGroup = SINGLE, linear_method: LinearMethod | None = None,
                 shards: list[tuple[int, int]] | None = None):
        """`shards`: (size, first row in the checkpoint tensor) of this rank's part of each
        sub-matrix, where it is not simply the rank's 1/tp slice (replicated KV heads)."""
        super().__init__()
        self.tp = tp
        self.input_size = input_size
        self.output_sizes = list(output_sizes)   # each part's rows in the checkpoint
        if shards is None:
            sizes = [tp.shard(s, "output size") for s in output_sizes]
            shards = [(n, tp.rank * n) for n in sizes]
        self.shard_sizes = [n for n, _ in shards]
        self.shard_sources = [start for _, start in shards]
        self.shard_offsets = [sum(self.shard_sizes[:i]) for i in range(len(self.shard_sizes))]
        self._set_method(linear_method)
        # The bias is split like the weight's rows, so the same loader fills both.
        self.linear_method.create_weights(self, input_size, self.shard_sizes, bias,
                                          self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        if getattr(param, "per_part", False):
            param.data[shard_id].copy_(loaded.reshape(()))
            return
        dim = getattr(param, "output_dim", 0)
        if dim is None:
            check_loaded_shape(param, loaded, None)
            param.data.copy_(loaded)
            return
        div = getattr(param, "output_div", 1)
        if param.dim() == loaded.dim():   # (a fused part's rows, the whole input)
            check_loaded_shape(param, loaded, dim, self.output_sizes[shard_id], div)
        size = self.shard_sizes[shard_id]
        what = f"part {shard_id} of a {type(self).__name__}"
        dst, n = _rows(size, self.shard_offsets[shard_id], div, what)
        src, _ = _rows(size, self.shard_sources[shard_id], div, what)
        param.data.narrow(dim, dst, n).copy_(loaded.narrow(dim, src, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices with the same input fused into one matmul (gate_up)."""

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a [gate | up] layer's output: one kernel where the linear method
        has one for x (the batch-1 GEMV), else the product and then the activation kernel."""
        if (self.bias is None and len(self.shard_sizes) == 2
                and self.shard_sizes[0] == self.shard_sizes[1]):
            y = self.linear_method.apply_gated(self, x)
            if y is not None:
                return y
        return silu_and_mul(self(x))


def kv_heads_of_rank(num_kv_heads: int, tp: TPGroup) -> tuple[int, int]:
    """(how many KV heads this rank holds, the first one). With more ranks than KV heads each
    head is replicated on tp / num_kv_heads ranks, each rank holding one."""
    if num_kv_heads >= tp.size:
        n = tp.shard(num_kv_heads, "num_key_value_heads")
        return n, tp.rank * n
    if tp.size % num_kv_heads != 0:
        raise ValueError(f"--tp-size {tp.size}: num_key_value_heads ({num_kv_heads}) must "
                         f"divide it when it is smaller")
    return 1, tp.rank * num_kv_heads // tp.size


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused; shard ids 'q', 'k', 'v'."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, tp: TPGroup = SINGLE,
                 linear_method: LinearMethod | None = None):
        q_heads = tp.shard(num_heads, "num_attention_heads")
        kv_heads, first_kv = kv_heads_of_rank(num_kv_heads, tp)
        q = (q_heads * head_dim, tp.rank * q_heads * head_dim)
        kv = (kv_heads * head_dim, first_kv * head_dim)
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim,
                                       num_kv_heads * head_dim], bias=bias, tp=tp,
                         linear_method=linear_method, shards=[q, kv, kv])
        self.q_size, self.kv_size = self.shard_sizes[0], self.shard_sizes[1]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str = 0) -> None:
        idx = {"q": 0, "k": 1, "v": 2}.get(shard_id, shard_id)  # type: ignore[arg-type]
        super().weight_loader(param, loaded, idx)  # type: ignore[arg-type]


class RowParallelLinear(_QuantizableLinear):
    """y = x W^T + b with W's input columns split across ranks; partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPGroup = SINGLE, linear_method: LinearMethod | None = None,
                 reduce_results: bool = True):
        """`reduce_results` False: return this rank's partial sum; the caller reduces it with
        others (an MoE block adds its shared experts' partial sums to the routed ones and
        all-reduces once)."""
        super().__init__()
        if bias and not reduce_results:
            raise ValueError("a row-parallel bias is added after the reduction")
        self.tp = tp
        self.reduce_results = reduce_results
        self.input_size = input_size
        self.input_shard = tp.shard(input_size, "input size")
        self._set_method(linear_method)
        # Every rank holds the whole bias (it is added once, after the reduction).
        self.linear_method.create_weights(self, self.input_shard, [output_size], bias,
                                          self.weight_loader, bias_loader=self._bias_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        dim = getattr(param, "input_dim", 1)
        if getattr(param, "per_part", False) or dim is None:
            param.data.copy_(loaded.reshape(param.shape))
            return
        div = getattr(param, "input_div", 1)
        check_loaded_shape(param, loaded, dim, self.input_size, div)
        first, n = _rows(self.input_shard, self.tp.rank * self.input_shard, div,
                         "a RowParallelLinear shard")
        param.data.copy_(loaded.narrow(dim, first, n))

    @staticmethod
    def _bias_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The method sees no bias: added to each rank's partial sum it would be counted
        # tp.size times by the all-reduce.
        y = self.linear_method.apply(self, x, None)
        if not self.reduce_results:
            return y
        y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias
