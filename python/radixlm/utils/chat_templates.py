"""--chat-template: the Jinja template chat requests are rendered with, instead of the one the
tokenizer ships (or when it ships none).

The flag takes, as SGLang's and vLLM's do, a path to a Jinja file, or a template written out on
the command line, or the name of a built-in template. Built-ins cover the common formats of
models whose tokenizer has no template (base models, some GGUF conversions). SGLang's JSON
"conversation" templates are a different, SGLang-only format: they are refused by name.

ServerArgs.validate checks the flag with it: stdlib and jinja2 only, nothing heavy.
"""

from __future__ import annotations

import os

# Messages reach a template with string content (None for an assistant turn that only calls
# tools), hence `or ''`.
BUILTIN_CHAT_TEMPLATES: dict[str, str] = {
    # <|im_start|>role ... <|im_end|> (Qwen, SmolLM2, many fine-tunes)
    "chatml": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '')"
        " + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    # Llama 3 / 3.1 / 3.2 instruct headers
    "llama-3-instruct": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
        " + (message['content'] or '') | trim + '<|eot_id|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{%- endif %}"
    ),
    # Gemma's turns: the assistant is called "model"; a system message opens the first turn
    "gemma-it": (
        "{{- bos_token }}"
        "{%- set ns = namespace(system='') %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' %}"
        "{%- set ns.system = (message['content'] or '') | trim + '\\n\\n' %}"
        "{%- else %}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{- '<start_of_turn>' + role + '\\n' + ns.system + (message['content'] or '') | trim"
        " + '<end_of_turn>\\n' }}"
        "{%- set ns.system = '' %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
    ),
}


# What ends the assistant's turn in each built-in template: chat requests stop there, since a
# model whose tokenizer had no template may not stop on its own end-of-sequence token.
BUILTIN_CHAT_STOPS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",),
    "llama-3-instruct": ("<|eot_id|>",),
    "gemma-it": ("<end_of_turn>",),
}


def chat_template_stops(value: str | None) -> tuple[str, ...]:
    """The stop strings a --chat-template value brings (a built-in's; none for a file or a
    written-out template, whose turns end as the model was trained to end them)."""
    return BUILTIN_CHAT_STOPS.get(value or "", ())


def load_chat_template(value: str) -> str:
    """The Jinja source `value` names: a built-in name, a file's contents, or `value` itself
    when it is a template. ValueError says which of these it is not."""
    if value in BUILTIN_CHAT_TEMPLATES:
        return BUILTIN_CHAT_TEMPLATES[value]
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        if path.endswith(".json"):
            raise ValueError(f"{value!r} is a JSON file; SGLang's JSON conversation templates "
                             f"are not supported here: pass a Jinja template (.jinja)")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read {value!r}: {e}") from None
        if not text.strip():
            raise ValueError(f"{value!r} is empty")
        return _checked(text, value)
    if "{{" in value or "{%" in value:
        return _checked(value, "the template")
    names = ", ".join(sorted(BUILTIN_CHAT_TEMPLATES))
    raise ValueError(f"{value!r} is not a file, a Jinja template or a built-in template name "
                     f"({names})")


def _checked(source: str, what: str) -> str:
    """`source`, once Jinja has parsed it (as transformers' sandbox will render it): a syntax
    error is reported at start-up, not by every chat request."""
    try:
        from jinja2.exceptions import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:     # (transformers needs jinja2 for any chat template)
        return source
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        env.parse(source)
    except TemplateSyntaxError as e:
        raise ValueError(f"{what} is not valid Jinja: {e.message} (line {e.lineno})") from None
    return source


__all__ = ["BUILTIN_CHAT_STOPS", "BUILTIN_CHAT_TEMPLATES", "chat_template_stops",
           "load_chat_template"]
