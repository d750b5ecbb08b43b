"""Server flags whose value is a JSON object (--preferred-sampling-params,
--json-model-override-args). Stdlib only: the config module checks them before anything heavy
is imported."""

from __future__ import annotations

import json
from typing import Any


def parse_json_object(text: str | None, what: str) -> dict[str, Any]:
    """The flag's value as a dict ({} when unset); ValueError saying it must be a JSON object
    of `what` when it is not one."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"must be a JSON object of {what}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object of {what}, got {text!r}")
    return value
