"""From final hidden states to what the sampler and the logprob outputs need.

Only the rows that matter get projected to the vocabulary: the last token of each request (next-
token logits), plus, for requests that asked for prompt logprobs, the positions in range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.core.forward_batch import ForwardBatch
from radixlm.core.logprobs import TokenLogprob, TopLogprobs, logprobs_of_tokens
from radixlm.utils.device import to_device


@dataclass
class InputLogprobs:
    token_logprobs: list[TokenLogprob]     # one per requested row, for its target token
    top_logprobs: list[TopLogprobs]        # one per requested row (empty lists when k == 0)
    # one per requested row: the asked token ids' logprobs (empty lists when none asked)
    token_ids_logprobs: list[TopLogprobs] = field(default_factory=list)


def last_token_hidden(hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
    """The hidden state of each request's last token this step ([B, H]); a decode step has one
    token per request, so all of `hidden`."""
    if fb.forward_mode.is_decode:
        return hidden
    ends, acc = [], 0
    for n in fb.extend_seq_lens_cpu:
        acc += n
        ends.append(acc - 1)
    return hidden[to_device(ends, torch.int64, fb.input_ids.device)]


def compute_input_logprobs(model, hidden: torch.Tensor, fb: ForwardBatch,
                           targets: list[list[int]], top_k: list[int],
                           token_ids: list[list[int] | None] | None = None
                           ) -> list[InputLogprobs]:
    """For request i, rows fb.input_logprob_rows[i] (relative to its new tokens) predict token
    targets[i][j]; return the logprob of each target, the top_k[i] best alternatives and the
    logprobs of the ids token_ids[i] asks about."""
    out = []
    starts = fb.extend_start_loc_cpu
    for i, rows in enumerate(fb.input_logprob_rows):
        if not rows:
            out.append(InputLogprobs([], []))
            continue
        idx = torch.tensor([starts[i] + r for r in rows], device=hidden.device)
        logprobs = torch.log_softmax(model.compute_logits(hidden[idx]), dim=-1)
        tgt = torch.tensor(targets[i], device=hidden.device)
        chosen = logprobs.gather(1, tgt[:, None]).squeeze(1).tolist()
        tops: list[TopLogprobs] = [[] for _ in rows]
        if top_k[i] > 0:
            vals, ids = logprobs.topk(min(top_k[i], logprobs.shape[-1]), dim=-1)
            tops = [list(zip(v, t)) for v, t in zip(vals.tolist(), ids.tolist())]
        asked = token_ids[i] if token_ids else None
        out.append(InputLogprobs(list(zip(chosen, targets[i])), tops,
                                 logprobs_of_tokens(logprobs, [asked] * len(rows))
                                 if asked else [[] for _ in rows]))
    return out
