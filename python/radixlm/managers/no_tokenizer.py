"""--skip-tokenizer-init: the server runs without a tokenizer (as SGLang's flag, for callers
that tokenize themselves, such as RL trainers). Prompts come as `input_ids` and outputs go back
as `output_ids` with no `text`. What needs the tokenizer is refused with a message that says
so, not served without it: text prompts, stop strings and stop_regex (matched on text),
structured outputs (a grammar walks the vocabulary's strings) and text in logprobs."""

from __future__ import annotations

from radixlm.managers.generate_request import SingleGenerate
from radixlm.sampling.params import CONSTRAINT_KINDS

FLAG = "--skip-tokenizer-init"


def check_without_tokenizer(single: SingleGenerate, text_in_logprobs: bool) -> None:
    """Raises ValueError for what a sequence asks that needs the tokenizer."""
    if single.text is not None:
        raise ValueError(f"this server runs with {FLAG} (no tokenizer): send the prompt as "
                         f"`input_ids`, not `text`")
    p = single.sampling_params
    needs_text = [name for name, used in (
        ("stop", bool(p.stop)), ("stop_regex", bool(p.stop_regex)),
        *((kind, getattr(p, kind) is not None) for kind in CONSTRAINT_KINDS)) if used]
    if needs_text:
        hint = "; use stop_token_ids to stop" if needs_text[0].startswith("stop") else ""
        raise ValueError(f"sampling_params.{needs_text[0]} needs the tokenizer, which this "
                         f"server runs without ({FLAG}){hint}")
    if text_in_logprobs:
        raise ValueError(f"return_text_in_logprobs needs the tokenizer, which this server "
                         f"runs without ({FLAG})")


def no_tokenizer_error(what: str) -> ValueError:
    """For an endpoint that needs the tokenizer (/v1 completions and chat, /tokenize)."""
    return ValueError(f"{what} needs the tokenizer, which this server runs without ({FLAG}); "
                      f"send `input_ids` to /generate")


def without_text(response: dict) -> dict:
    """A /generate result as SGLang gives it under the flag: output_ids and meta_info."""
    response.pop("text", None)
    return response
