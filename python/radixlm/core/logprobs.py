"""Logprob types shared by the logits layer, the scheduler and the messages between processes."""

from __future__ import annotations

# (logprob, token_id); logprob is None for the first prompt token, which has no context.
TokenLogprob = tuple[float | None, int]
# the top alternatives at one position: [(logprob, token_id), ...], best first
TopLogprobs = list[tuple[float, int]]


def logprobs_of_tokens(logits, token_ids: list[list[int] | None]) -> list[TopLogprobs]:
    """Per row of `logits` ([rows, vocab], a torch tensor), [(logprob, id)] of the token ids that
    row asks about (SGLang's `token_ids_logprob`), in the order asked: log_softmax of the logits
    as given; [] for a row that asks none. One host copy for the batch."""
    import torch

    out: list[TopLogprobs] = [[] for _ in token_ids]
    rows = [i for i, ids in enumerate(token_ids) if ids]
    if not rows:
        return out
    width = max(len(token_ids[i]) for i in rows)
    index = torch.tensor([token_ids[i] + [0] * (width - len(token_ids[i])) for i in rows],
                         dtype=torch.int64, device=logits.device)
    picked = logits if len(rows) == logits.shape[0] else logits[
        torch.tensor(rows, dtype=torch.int64, device=logits.device)]
    picked = picked.float()
    values = (picked.gather(1, index) - torch.logsumexp(picked, dim=-1, keepdim=True)).tolist()
    for r, i in enumerate(rows):
        out[i] = list(zip(values[r][:len(token_ids[i])], token_ids[i]))
    return out
