"""One rule, for every path flag, for what may name a Hugging Face Hub repository."""
from __future__ import annotations

import os


def could_be_hub_id(path: str) -> bool:
    """Whether `path`, which does not exist locally, may be a Hub id: ORG/NAME, or a bare NAME
    such as gpt2 (the Hub still serves those from their new home)."""
    return bool(path) and path.count("/") <= 1 and not path.startswith((".", "/", "~")) \
        and not path.endswith("/")


def exists_or_could_be_hub_id(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path)) or could_be_hub_id(path)
