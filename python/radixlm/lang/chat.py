"""Rendering chat roles (`system`, `user`, `assistant`) into prompt text.

The program's text must be exactly what the model's chat template produces for the same
messages, or generations after a role see a prompt the model was not trained on. Templates are
Jinja programs over a whole message list, not per-role strings, so we derive each piece by
rendering and diffing:

- begin(role) = render(msgs + [{role, SENTINEL}]) between render(msgs) and the sentinel
  (for the assistant it is the template's generation prompt, which is what it appends before
  the model speaks);
- end(role, content) = what render(msgs + [{role, content}]) has after `content`, with the real
  content, so templates that look at the content still match.

This works for templates that are prefix-stable (rendering more messages only appends text), the
common case. Where a template is not, or cannot be loaded, the plain renderer's "Role: text"
format keeps programs running, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

logger = logging.getLogger(__name__)

_SENTINEL = "\x00RADIXLM-ROLE-CONTENT\x00"


class ChatRenderer(Protocol):
    def begin(self, messages: list[dict[str, str]], role: str) -> str: ...

    def end(self, messages: list[dict[str, str]], role: str, begin: str, content: str) -> str: ...


class PlainRenderer:
    """"System: ..." lines: for backends without a template (display only for OpenAI chat)."""

    def begin(self, messages: list[dict[str, str]], role: str) -> str:
        return f"{role.capitalize()}: "

    def end(self, messages: list[dict[str, str]], role: str, begin: str, content: str) -> str:
        return "\n"


class TemplateRenderer:
    """Roles rendered by a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self._fallback = PlainRenderer()
        self._warned = False

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        if not messages and not add_generation_prompt:
            return ""  # some templates index messages[0]; nothing rendered is the right answer
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def begin(self, messages: list[dict[str, str]], role: str) -> str:
        try:
            base = self._render(messages)
            if role == "assistant" and messages:
                # (transformers refuses a generation prompt for no messages: an assistant turn
                # that opens the program takes the sentinel's way below)
                prompt = self._render(messages, add_generation_prompt=True)
                if prompt.startswith(base) and len(prompt) > len(base):
                    return prompt[len(base):]
            full = self._render(messages + [{"role": role, "content": _SENTINEL}])
            cut = full.find(_SENTINEL)
            if full.startswith(base) and cut >= len(base):
                return full[len(base):cut]
        except Exception as e:  # a template that rejects this message order, for instance
            return self._fall_back(f"the chat template failed: {e}").begin(messages, role)
        return self._fall_back("the chat template is not prefix-stable").begin(messages, role)

    def end(self, messages: list[dict[str, str]], role: str, begin: str, content: str) -> str:
        try:
            base = self._render(messages)
            full = self._render(messages + [{"role": role, "content": content}])
            expected = base + begin + content
            if full.startswith(expected):
                return full[len(expected):]
            # The template changes the content (e.g. strips it): take its suffix for this role.
            with_sentinel = self._render(messages + [{"role": role, "content": _SENTINEL}])
            cut = with_sentinel.find(_SENTINEL)
            if cut >= 0:
                return with_sentinel[cut + len(_SENTINEL):]
        except Exception as e:
            return self._fall_back(f"the chat template failed: {e}").end(messages, role, begin,
                                                                         content)
        return self._fall_back("the chat template is not prefix-stable").end(messages, role,
                                                                             begin, content)

    def _fall_back(self, why: str) -> PlainRenderer:
        if not self._warned:
            logger.warning("%s; rendering roles as plain 'Role: text' lines instead", why)
            self._warned = True
        return self._fallback


def load_renderer(tokenizer_path: str | None, chat_template: str | None = None) -> ChatRenderer:
    """The chat template of the tokenizer at `tokenizer_path` (or `chat_template`, the server's
    --chat-template, rendered with that tokenizer), or the plain format (warning)."""
    if tokenizer_path:
        try:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
            if chat_template:
                tokenizer.chat_template = chat_template
            return TemplateRenderer(tokenizer)
        except Exception as e:  # unreadable path (remote server), no template, ...
            logger.warning("cannot use the chat template of %r (%s); roles will be rendered as "
                           "plain 'Role: text' lines", tokenizer_path, e)
    else:
        logger.warning("the backend did not say where its tokenizer is; roles will be rendered "
                       "as plain 'Role: text' lines")
    return PlainRenderer()
