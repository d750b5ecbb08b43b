"""Reasoning blocks: the text between <think> and </think> goes to `reasoning_content`, the rest
to `content` (--reasoning-parser, SGLang's names).

- deepseek-r1: the model starts inside its thinking (the opening tag is in the prompt, or not
  written at all), so everything up to </think> is reasoning; a leading <think> is dropped.
- qwen3: thinking starts only at a <think> the model writes, or when the rendered prompt ends
  inside an open <think> (templates of always-thinking models put it there). With
  chat_template_kwargs {"enable_thinking": false} Qwen3's template closes the block in the
  prompt and the whole answer is content.

An unclosed block (the budget ran out while thinking) is all reasoning. Like the tool-call
parsers, `split` is a pure, monotone function of the text so far, so streaming sends
differences of it. The native API does not use this: it keeps the raw text.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.parsers.function_call.base import partial_marker_len

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass
class ReasoningSplit:
    reasoning: str
    content: str


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_in_reasoning: bool   # deepseek-r1: output begins inside the thinking block

    def starts_inside(self, prompt: str) -> bool:
        """Does the output begin inside a thinking block, given the rendered prompt?"""
        last_open, last_close = prompt.rfind(THINK_START), prompt.rfind(THINK_END)
        if self.starts_in_reasoning:
            # ... unless the prompt itself closed the block (thinking switched off).
            return not (last_close >= 0 and prompt.rstrip().endswith(THINK_END))
        return last_open > last_close

    def split(self, text: str, inside: bool, final: bool) -> ReasoningSplit:
        """Reasoning and content of the output so far; `inside` from starts_inside.
        While streaming (final=False), text that may still become a tag is held back."""
        stripped = text.lstrip()
        if stripped.startswith(THINK_START):
            begin = len(text) - len(stripped) + len(THINK_START)
        elif not final and THINK_START.startswith(stripped):
            return ReasoningSplit("", "")      # may be the opening tag arriving
        elif inside:
            begin = 0
        else:
            return ReasoningSplit("", text)    # no thinking block: all content
        end = text.find(THINK_END, begin)
        if end < 0:
            reasoning = text[begin:]
            if not final:
                reasoning = reasoning[:len(reasoning) - partial_marker_len(reasoning, THINK_END)]
            return ReasoningSplit(reasoning.strip(), "")
        return ReasoningSplit(text[begin:end].strip(), text[end + len(THINK_END):].lstrip())


REASONING_PARSERS = {
    "deepseek-r1": ReasoningParser("deepseek-r1", starts_in_reasoning=True),
    "qwen3": ReasoningParser("qwen3", starts_in_reasoning=False),
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    return REASONING_PARSERS[name]
