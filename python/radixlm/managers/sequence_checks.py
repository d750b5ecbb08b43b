"""The checks of one sequence of a generate request that need the served model: its prompt ids
(tokenized, in the vocabulary, fitting the context and the KV cache) and the settings that
depend on them or on the requests already running (rid, logprob ranges, token ids, the
budget against the context). `GenerateReqInput.groups` checked everything else before."""

from __future__ import annotations

from typing import Any, Mapping

from radixlm.managers.generate_request import SingleGenerate
from radixlm.managers.messages import SchedulerReady
from radixlm.managers.prompt_length import check_text_fits, context_exceeded, fit_to_context


def prompt_ids(single: SingleGenerate, tokenizer: Any, ready: SchedulerReady,
               allow_truncate: bool) -> list[int]:
    """The sequence's prompt as token ids (ValueError when it cannot run); with
    --allow-auto-truncate, one past the context keeps its head."""
    if single.input_ids is not None:
        ids = single.input_ids
    else:
        if not allow_truncate:
            check_text_fits(single.text, tokenizer, ready.context_len)
        ids = tokenizer(single.text).input_ids
    if not ids:
        raise ValueError("the prompt is empty (`text` / `input_ids` must not be empty)")
    vocab = ready.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:   # (C loops; the message's list only then)
        bad = [t for t in ids if not 0 <= t < vocab]
        raise ValueError(f"input_ids contains token ids outside the vocabulary: {bad[:5]}")
    ids = fit_to_context(ids, ready.context_len, allow_truncate)
    if ready.max_prompt_tokens and len(ids) > ready.max_prompt_tokens:
        raise ValueError(f"the prompt has {len(ids)} tokens, more than the KV cache holds "
                         f"with room for a new token ({ready.max_prompt_tokens}; "
                         f"--max-total-tokens, --mem-fraction-static)")
    return ids


def check_sequence(s: SingleGenerate, ids: list[int], seen: set[str], running: Mapping[str, Any],
                   ready: SchedulerReady, allow_truncate: bool) -> None:
    """What `GenerateReqInput.groups` could not check (it has no vocabulary, context length or
    running requests: `running` maps their rids); also clamps the budget to the context.
    `seen`: the rids of the request's earlier sequences (this one's is added)."""
    if s.rid in seen:
        raise ValueError("the request repeats a `rid`; each sequence needs its own")
    seen.add(s.rid)
    if s.rid in running:
        raise ValueError(f"a request with rid {s.rid!r} is already running")
    if s.return_logprob and s.logprob_start_len >= len(ids):
        # (as SGLang: no prompt logprob would start there; -1 means the output's only)
        raise ValueError(f"logprob_start_len ({s.logprob_start_len}) must be lower than "
                         f"the number of input tokens ({len(ids)})")
    if s.top_logprobs_num > ready.vocab_size:
        raise ValueError(f"top_logprobs_num must be <= the vocabulary size "
                         f"({ready.vocab_size})")
    s.sampling_params.check_token_ids(ready.vocab_size)
    if s.token_ids_logprob and max(s.token_ids_logprob) >= ready.vocab_size:
        raise ValueError(f"token_ids_logprob has token id {max(s.token_ids_logprob)}, "
                         f"outside the vocabulary ({ready.vocab_size} tokens)")
    # As SGLang: a budget the request names beyond what the context leaves is refused
    # (--allow-auto-truncate: clamped); the default budget is clamped (the finish reason
    # then says "length" with the budget that applied).
    params = s.sampling_params
    room = ready.context_len - len(ids)
    if params.max_new_tokens > room:
        if s.budget_given and not allow_truncate:
            raise ValueError(context_exceeded(ready.context_len, len(ids),
                                              params.max_new_tokens))
        params.max_new_tokens = room
