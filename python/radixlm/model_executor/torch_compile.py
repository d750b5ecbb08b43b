"""`--enable-torch-compile`: the decode forward compiled by torch.compile (inductor).

What is compiled: the model's forward and LM head for decode batches of up to
`--torch-compile-max-bs` rows, once, at start-up, with the row count symbolic (an unbacked size:
no recompilation for any batch size). With CUDA graphs (the default on a GPU) each captured
batch size records the compiled kernels, so a replay runs them with no Python at all; without
graphs (CPU, `--disable-cuda-graph`) decode steps call the compiled forward directly. Larger
batches, prefills and mixed steps stay eager.

How the model is traced: attention is one opaque custom op, `radixlm::attention` (the attention
backend's kernels, its KV pool writes and its per-step metadata stay exactly as in eager mode;
the op finds the layer by a registry key and the step's ForwardBatch in `decode_step`). Everything
between attention calls (embedding, RMSNorm with the residual add, Qwen3's q/k norms, rotary,
SiLU-and-mul, the GEMMs) is traced from the layers' plain PyTorch code: `use_fused` answers no
while dynamo traces (layers/kernels/__init__.py), so inductor sees the whole layer and fuses the
small ops itself instead of calling the hand-written Triton kernels.

Compile time is reported as the start-up phase `torch_compile`; inductor's caches (compiled
graphs, Triton kernels, under TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_<user>) make
a restart with the same model faster; dynamo's tracing is repeated each time.

Limits, checked up front (`check_supported`) so the flag is never silently ignored: dense
Llama-family models (Llama, Mistral, Qwen2, Qwen3), unquantized weights, one rank.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch, ForwardMode
from radixlm.layers.attention.base import AttentionBackend
from radixlm.layers.attention.traced import decode_step, register_layers

# Models whose forward reads the ForwardBatch only through their attention layers (the custom
# op hides it from the tracer); MoE and MLA models read it elsewhere too.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")


def check_supported(architecture: str, quantization: str | None, tp_size: int,
                    kv_is_fp8: bool) -> None:
    """Raise ValueError naming the flag when --enable-torch-compile cannot serve this model."""
    flag = "--enable-torch-compile"
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{flag}: supported for {', '.join(SUPPORTED_ARCHITECTURES)}; this "
                         f"model is {architecture}")
    if quantization is not None:
        raise ValueError(f"{flag}: not supported with --quantization {quantization} yet")
    if tp_size != 1:
        raise ValueError(f"{flag}: not supported with --tp-size {tp_size} yet")
    if kv_is_fp8:
        raise ValueError(f"{flag}: not supported with --kv-cache-dtype fp8_e4m3 yet")


class CompiledDecode:
    """The compiled decode forward of one model: `__call__(fb)` -> next-token logits [B, V],
    for decode batches of up to `max_bs` rows (`can_run`)."""

    def __init__(self, model: nn.Module, max_bs: int):
        register_layers(model)
        self.max_bs = max_bs

        def forward_and_logits(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            hidden = model(input_ids, positions, None)      # attention reads _STEP instead
            return model.compute_logits(hidden)

        self._compiled: Callable = torch.compile(forward_and_logits, dynamic=True,
                                                 fullgraph=True)

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.forward_mode.is_decode and 0 < fb.batch_size <= self.max_bs
                and not fb.input_logprob_rows)

    @torch.inference_mode()
    def warm_up(self, backend: AttentionBackend, device: torch.device) -> None:
        """Compile before serving, with a batch of 2 rows (any size would do: the row count is
        symbolic). The rows write the KV pool's padding slot 0 and read it back, as a CUDA
        graph's padded rows do."""
        bs = min(2, self.max_bs)
        # (Distinct tensors: dynamo would guard on input_ids being positions.)
        ids, positions, slots, req_rows = (torch.zeros(bs, dtype=torch.int64, device=device)
                                           for _ in range(4))
        fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=ids,
                          positions=positions, out_cache_loc=slots, req_pool_indices=req_rows,
                          seq_lens=torch.ones(bs, dtype=torch.int64, device=device),
                          seq_lens_cpu=[1] * bs, extend_prefix_lens_cpu=[0] * bs,
                          extend_seq_lens_cpu=[1] * bs)
        backend.init_forward_metadata(fb)
        self(fb)

    def __call__(self, fb: ForwardBatch) -> torch.Tensor:
        # The row count is an unbacked size: dynamo does not specialise 1 (or any size), so
        # the graph compiled once serves every batch.
        torch._dynamo.decorators.mark_unbacked(fb.input_ids, 0)
        torch._dynamo.decorators.mark_unbacked(fb.positions, 0)
        with decode_step(fb):
            return self._compiled(fb.input_ids, fb.positions)
