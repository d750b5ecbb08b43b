"""A tokenizer for the processes that only turn text into ids and back (the scheduler: stop
strings and jump-forward; the detokenizer), read from `tokenizer.json` with the `tokenizers`
library directly, without importing transformers.

Why: `import transformers` plus `AutoTokenizer` costs seconds of CPU in every process that does
it (3 s here, 6-18 s on a fresh GPU host), and in the scheduler it ran beside the CUDA-graph
capture, which then waited for the interpreter lock (capture 1.7 s alone, 8.4 s beside it). The
`tokenizers` library loads the same file in ~0.2 s.

It is used only where it gives transformers' answers (`light_tokenizer_reason`,
`_added_tokens_reason`): a tokenizer.json whose tokenizer_config.json names a generic fast class
(transformers builds model-specific classes such as Qwen2Tokenizer from its own definitions,
which may differ from the file; it does so for some model types whatever the config says, so
config.json's model type must be one known to keep the generic class), no custom code,
`clean_up_tokenization_spaces` explicitly false (its default and handling differ between
transformers versions), no `split_special_tokens`, and every token the configs name as special
already a special added token of tokenizer.json (transformers would add or re-flag it). The
file's truncation and padding are turned off, as transformers' encode does. Anything else loads
transformers' tokenizer (`load_tokenizer`). What needs the whole tokenizer (xgrammar's
TokenizerInfo) asks `full()`, loaded once, then.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any, Sequence

from radixlm.model_executor.weight_source import load_tokenizer, resolve_tokenizer_dir

if TYPE_CHECKING:
    import tokenizers
    from transformers import PreTrainedTokenizerBase

# tokenizer_config.json classes that transformers loads from tokenizer.json as it stands.
GENERIC_FAST_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
# config.json model types for which transformers keeps such a class (None: no config.json).
GENERIC_MODEL_TYPES = frozenset({None, "llama", "mistral", "mixtral"})
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                      "cls_token", "mask_token")


class LightTokenizer:
    """encode / decode / len with transformers' fast-tokenizer semantics, for one directory."""

    def __init__(self, path: str, backend: "tokenizers.Tokenizer") -> None:
        self.path = path
        self.backend_tokenizer = backend
        self._len = backend.get_vocab_size(with_added_tokens=True)
        self._full: PreTrainedTokenizerBase | None = None
        self._full_lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if add_special_tokens:   # (transformers may rebuild the post-processor from its config)
            return self.full().encode(text, add_special_tokens=True)
        return self.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False,
               **_slow_only: Any) -> str:
        # (`spaces_between_special_tokens` and friends only change slow tokenizers' output.)
        ids = [ids] if isinstance(ids, int) else list(ids)
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._len

    def full(self) -> "PreTrainedTokenizerBase":
        """transformers' tokenizer for the same directory (imports transformers, once)."""
        with self._full_lock:
            if self._full is None:
                self._full = load_tokenizer(self.path)
            return self._full


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    return value.get("content") if isinstance(value, dict) else None


def _named_special_tokens(*configs: dict) -> set[str]:
    """The tokens transformers treats as special: the named ones (bos, eos, ...) and the lists
    of additional / extra special tokens, from tokenizer_config.json and
    special_tokens_map.json."""
    names: set[str] = set()
    for config in configs:
        for key in SPECIAL_TOKEN_KEYS:
            content = _token_content(config.get(key))
            if content:
                names.add(content)
        for key in ("additional_special_tokens", "extra_special_tokens"):
            extra = config.get(key) or []
            for value in (extra.values() if isinstance(extra, dict) else extra):
                content = _token_content(value)
                if content:
                    names.add(content)
    return names


def light_tokenizer_reason(path: str) -> str | None:
    """None when `path`'s files leave transformers nothing to change in tokenizer.json's
    tokenizer, else why not (for the log). The added tokens are checked on load."""
    if not os.path.isdir(path):
        return "not a directory"
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return "no tokenizer.json"
    config = _read_json(os.path.join(path, "tokenizer_config.json"))
    if config is None:
        return "no readable tokenizer_config.json"
    if "auto_map" in config:
        return "custom tokenizer code"
    if config.get("tokenizer_class") not in GENERIC_FAST_CLASSES:
        return f"tokenizer class {config.get('tokenizer_class')!r}"
    if config.get("clean_up_tokenization_spaces") is not False:
        return "clean_up_tokenization_spaces is not false"
    if config.get("split_special_tokens"):
        return "split_special_tokens"
    # transformers builds its own class for some model types whatever the config says
    # (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, which changes between versions): only the
    # model types known to keep the generic class.
    model = _read_json(os.path.join(path, "config.json"))
    if model is not None and model.get("model_type") not in GENERIC_MODEL_TYPES:
        return f"model type {model.get('model_type')!r}"
    return None


def _added_tokens_reason(path: str, backend: "tokenizers.Tokenizer") -> str | None:
    """Why transformers' added / special tokens would differ from tokenizer.json's: it adds the
    tokens its configs name that the file lacks, and treats the named ones as special."""
    config = _read_json(os.path.join(path, "tokenizer_config.json")) or {}
    special_map = _read_json(os.path.join(path, "special_tokens_map.json")) or {}
    added = backend.get_added_tokens_decoder()
    by_content = {t.content: (i, t.special) for i, t in added.items()}
    for name in sorted(_named_special_tokens(config, special_map)):
        if by_content.get(name, (None, False))[1] is not True:
            return f"special token {name!r} is not a special added token of tokenizer.json"
    for key, value in (config.get("added_tokens_decoder") or {}).items():
        content = _token_content(value)
        special = value.get("special", False) if isinstance(value, dict) else False
        if str(key).isdigit() and by_content.get(content) != (int(key), bool(special)):
            return f"added token {content!r} differs from tokenizer.json's"
    return None


def load_light_tokenizer(path: str) -> LightTokenizer | None:
    if light_tokenizer_reason(path) is not None:
        return None
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    if _added_tokens_reason(path, backend) is not None:
        return None
    # transformers encodes without the file's truncation and padding settings.
    backend.no_truncation()
    backend.no_padding()
    return LightTokenizer(path, backend)


def load_ids_tokenizer(path: str) -> "LightTokenizer | PreTrainedTokenizerBase":
    """The tokenizer for encode / decode only: LightTokenizer where it is exact, else
    transformers'. A GGUF file is converted first (once; cached on disk)."""
    path = resolve_tokenizer_dir(path)
    return load_light_tokenizer(path) or load_tokenizer(path)


def full_tokenizer(tokenizer: Any) -> Any:
    """transformers' tokenizer behind `tokenizer` (itself when it is one already)."""
    return tokenizer.full() if isinstance(tokenizer, LightTokenizer) else tokenizer
