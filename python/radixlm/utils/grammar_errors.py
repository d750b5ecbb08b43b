"""What a grammar compiler's (xgrammar's) error says, for a client: its message without the
"[time] file.cc:line: " prefix it carries. Used by the structured-output backend and by the
tool-call grammar, which sit in packages that must not import each other."""

from __future__ import annotations

import re


def compiler_reason(e: Exception) -> str:
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", lines[0])


__all__ = ["compiler_reason"]
