"""What the sampler needs to know of one request, built by the scheduler each step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from radixlm.sampling.params import SamplingParams


@dataclass
class SamplingRequest:
    """What the sampler needs to know of one request; built by the scheduler each step."""

    params: SamplingParams
    seed: int  # the scheduler draws a random one when params.sampling_seed is None
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  # tokens generated so far; the sampled one is number len(output_ids)
    eos_token_ids: Sequence[int] = ()  # model EOS ids (only used by min_new_tokens)
    # Tokens already sampled by a step still running on the GPU (overlap scheduler) and not yet in
    # output_ids: the noise key counts them so a token's randomness does not depend on the lag.
    num_pending: int = 0
