"""The decode roofline's weight bytes: every parameter once, the input embedding table not at
all (a step reads only its looked-up rows), a table tied to the LM head once, as the head."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.bench.one_batch import decode_weight_bytes
from radixlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding


class _Tiny(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(100, 8)
        self.proj = nn.Linear(8, 8, bias=False)
        self.lm_head = ParallelLMHead(100, 8, tie_to=self.embed_tokens if tied else None)


def test_embedding_table_is_not_read_by_a_decode_step():
    size = torch.empty((), dtype=torch.float32).element_size()
    assert decode_weight_bytes(_Tiny(tied=False)) == (8 * 8 + 100 * 8) * size


def test_a_tied_table_is_read_once_as_the_lm_head():
    size = torch.empty((), dtype=torch.float32).element_size()
    assert decode_weight_bytes(_Tiny(tied=True)) == (8 * 8 + 100 * 8) * size
