"""A tokenizer for the processes that only turn text into ids and back (the scheduler: stop
strings and jump-forward; the detokenizer), read from `tokenizer.json` with the `tokenizers`
library directly, without importing transformers.

Why: `import transformers` plus `AutoTokenizer` costs seconds of CPU in every process that does
it (3 s here, 6-18 s on a fresh GPU host), and in the scheduler it ran beside the CUDA-graph
capture, which then waited for the interpreter lock (capture 1.7 s alone, 8.4 s beside it). The
`tokenizers` library loads the same file in ~0.2 s.

It is used only where it gives transformers' answers: a tokenizer.json whose tokenizer_config.json
names a generic fast class (transformers builds model-specific classes such as Qwen2Tokenizer from
its own definitions, which may differ from the file), no custom code, and
`clean_up_tokenization_spaces` explicitly false (its default and its handling differ between
transformers versions). Anything else loads transformers' tokenizer (`load_tokenizer`).
What needs the whole tokenizer (xgrammar's TokenizerInfo) asks `full()`, loaded once, then.
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


class LightTokenizer:
    """encode / decode / len with transformers' fast-tokenizer semantics, for one directory."""

    def __init__(self, path: str, backend: "tokenizers.Tokenizer") -> None:
        self.path = path
        self.backend_tokenizer = backend
        self._len = backend.get_vocab_size(with_added_tokens=True)
        self._full: PreTrainedTokenizerBase | None = None
        self._full_lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False,
               **_slow_only: Any) -> str:
        # (`spaces_between_special_tokens` and friends only change slow tokenizers' output.)
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._len

    def full(self) -> "PreTrainedTokenizerBase":
        """transformers' tokenizer for the same directory (imports transformers, once)."""
        with self._full_lock:
            if self._full is None:
                self._full = load_tokenizer(self.path)
            return self._full


def light_tokenizer_reason(path: str) -> str | None:
    """None when `path` can be served by LightTokenizer, else why not (for the log)."""
    if not os.path.isdir(path):
        return "not a directory"
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return "no tokenizer.json"
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "no readable tokenizer_config.json"
    if "auto_map" in config:
        return "custom tokenizer code"
    if config.get("tokenizer_class") not in GENERIC_FAST_CLASSES:
        return f"tokenizer class {config.get('tokenizer_class')!r}"
    if config.get("clean_up_tokenization_spaces") is not False:
        return "clean_up_tokenization_spaces is not false"
    return None


def load_light_tokenizer(path: str) -> LightTokenizer | None:
    if light_tokenizer_reason(path) is not None:
        return None
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    return LightTokenizer(path, backend)


def load_ids_tokenizer(path: str) -> "LightTokenizer | PreTrainedTokenizerBase":
    """The tokenizer for encode / decode only: LightTokenizer where it is exact, else
    transformers'. A GGUF file is converted first (once; cached on disk)."""
    path = resolve_tokenizer_dir(path)
    return load_light_tokenizer(path) or load_tokenizer(path)


def full_tokenizer(tokenizer: Any) -> Any:
    """transformers' tokenizer behind `tokenizer` (itself when it is one already)."""
    return tokenizer.full() if isinstance(tokenizer, LightTokenizer) else tokenizer
