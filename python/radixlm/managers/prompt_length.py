"""A length check that runs before tokenizing: a text so long that it cannot fit the context
whatever its tokens are is rejected at once (tokenizing megabytes costs seconds of CPU)."""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def max_chars_per_token(tokenizer: Any) -> int:
    """An upper bound on the characters one token stands for: its vocabulary entry's length
    (byte-level entries spell each byte as one character, so never fewer than it decodes to)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


def check_text_fits(text: str, tokenizer: Any, context_len: int) -> None:
    """Raise ValueError when `text` has more characters than `context_len` tokens can hold."""
    check_chars_fit(len(text), tokenizer, context_len)


def check_chars_fit(num_chars: int, tokenizer: Any, context_len: int) -> None:
    """Raise ValueError when `num_chars` characters are more than `context_len` tokens hold."""
    if num_chars > context_len * max_chars_per_token(tokenizer):
        raise ValueError(f"the prompt has {num_chars} characters, more than the context "
                         f"length of {context_len} tokens can hold")


def fit_to_context(ids: list[int], context_len: int, allow_truncate: bool) -> list[int]:
    """`ids`, when they leave room for at least one new token in the context. Otherwise, with
    --allow-auto-truncate, their first context_len - 1 tokens (as SGLang keeps the head of the
    prompt); without it, ValueError."""
    if len(ids) < context_len:
        return ids
    if allow_truncate:
        logger.warning("a prompt of %d tokens was truncated to %d (--allow-auto-truncate)",
                       len(ids), context_len - 1)
        return ids[:context_len - 1]
    raise ValueError(f"the prompt has {len(ids)} tokens, which does not fit the context "
                     f"length of {context_len} tokens (shorten it, or start the server with "
                     f"--allow-auto-truncate)")


def context_exceeded(context_len: int, prompt_tokens: int, max_new_tokens: int) -> str:
    """The refusal of a budget past the context. It opens with the phrase SGLang's refusal
    opens with, which clients match to recognise a context overflow."""
    return (f"Requested token count exceeds the model's maximum context length of "
            f"{context_len} tokens: the prompt has {prompt_tokens} tokens and "
            f"max_new_tokens asks for {max_new_tokens} more. Ask for at most "
            f"{max(context_len - prompt_tokens, 0)}, or start the server with "
            f"--allow-auto-truncate to have the budget cut to fit.")
