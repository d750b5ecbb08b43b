"""The one forward function: attention metadata, the model, the LM head on the last tokens.

The model runner calls it eagerly; the CUDA graph runner calls it inside a capture (with the
backend's capture-time metadata). Both therefore run exactly the same computation.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch
from radixlm.layers.attention.base import AttentionBackend
from radixlm.layers.logits import last_token_hidden


def run_model(model: nn.Module, backend: AttentionBackend, fb: ForwardBatch,
              capturing: bool = False, logits_out: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (hidden states of every new token [T, H], next-token logits [B, V]); the logits
    are written into `logits_out` when it is given."""
    if capturing:
        backend.init_forward_metadata_capture(fb)
    else:
        backend.init_forward_metadata(fb)
    hidden = model(fb.input_ids, fb.positions, fb)
    return hidden, model.compute_logits(last_token_hidden(hidden, fb), out=logits_out)
