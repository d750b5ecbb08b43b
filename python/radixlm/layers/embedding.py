"""Token embedding and LM head, split over the vocabulary for tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.linear import check_loaded_shape


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.shard = -(-vocab_size // tp.size)
        self.start = tp.rank * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        check_loaded_shape(param, loaded, 0, self.vocab_size)
        part = loaded[self.start:self.start + self.shard]
        param.data.zero_()
        param.data[:part.shape[0]].copy_(part)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.shard)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; `tie_to` shares the embedding's weight (tied word embeddings)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup = SINGLE,
                 tie_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden_size, tp)
        if tie_to is not None:
            self.weight = tie_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = F.linear(hidden, self.weight)
        return self.tp.all_gather_last_dim(logits)[..., :self.vocab_size]
