"""Jump-forward decoding (the compressed finite-state machine of the SGLang paper).

When the grammar allows exactly one continuation string (a key, punctuation, a fixed field), the
request takes it in one step instead of one decode step per token. The forced string is
tokenized together with the text of the last few output tokens, so that token boundaries come
out as the tokenizer would make them (e.g. `"` + `name` may become `"name`), and the matcher is
rolled back and replayed over the new tokens so it stays in step.

Only tokens not yet sent to the client are re-tokenized; for streaming requests that is the
token sampled this step, and the forced string is otherwise appended as its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.constrained.base import GrammarMatcher

RETOKENIZE_WINDOW = 3


@dataclass
class Jump:
    num_replaced: int        # trailing output tokens that the new tokens replace
    new_tokens: list[int]


def plan_jump(tokenizer, matcher: GrammarMatcher, output_ids: list[int], num_unsent: int,
              room: int, forced: str | None = None) -> Jump | None:
    """Find the forced continuation and its tokens, advancing the matcher over them.

    `room` is how many output tokens max_new_tokens still allows after replacing the tail;
    `forced`: the matcher's forced string, when the caller already asked for it.
    Returns None (matcher untouched) when nothing is forced or the tokens don't fit the grammar.
    """
    if forced is None:
        forced = matcher.find_jump_forward_string()
    if not forced:
        return None
    k = min(RETOKENIZE_WINDOW, len(output_ids), num_unsent)
    while k > 0:
        tail_text = tokenizer.decode(output_ids[-k:])
        if "\ufffd" not in tail_text:  # a whole-character boundary: safe to re-tokenize
            break
        k -= 1
    tail = output_ids[len(output_ids) - k:]
    tail_text = tokenizer.decode(tail) if k else ""
    new = tokenizer.encode(tail_text + forced, add_special_tokens=False)
    if tokenizer.decode(new) != tail_text + forced:
        # The tokenizer does not round-trip this text: keep the tail, append the forced string.
        k, tail = 0, []
        new = tokenizer.encode(forced, add_special_tokens=False)
    new = new[:room + k]
    if len(new) <= k and new == tail:
        return None
    matcher.rollback(k)
    accepted = 0
    for tok in new:
        if not matcher.accept_token(tok):
            break
        accepted += 1
    if accepted < len(new):  # undo: the grammar and this tokenization disagree
        matcher.rollback(accepted)
        for tok in tail:
            matcher.accept_token(tok)
        return None
    return Jump(num_replaced=k, new_tokens=new)
