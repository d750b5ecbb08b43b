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
        value = json.loads(text, parse_constant=_not_json)
    except (json.JSONDecodeError, _NotJson) as e:
        raise ValueError(f"must be a JSON object of {what}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object of {what}, got {text!r}")
    return value


def _not_json(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have (a NaN in a model's
    # config or a sampling default would only fail, or worse, much later).
    raise _NotJson(f"{name} is not a JSON value")


class _NotJson(ValueError):
    pass
