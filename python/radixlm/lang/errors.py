"""Errors a program author can act on.

Each class says what went wrong in the author's terms (a variable, a backend, a feature), and
inherits the built-in exception a Python programmer would naturally catch for it (KeyError for a
missing variable, ValueError for a rejected request, NotImplementedError for an unsupported
feature), so existing `except` clauses keep working.
"""

from __future__ import annotations


class LangError(Exception):
    """Base class of every error raised by `radixlm.lang`."""


class VariableNotFoundError(LangError, KeyError):
    """`s[name]` for a name that no gen / select of the program defined."""

    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(name)

    def __str__(self) -> str:  # KeyError's default str() would only quote the name
        have = ", ".join(repr(k) for k in sorted(self.known)) or "none"
        return (f"the program has no variable {self.name!r} (defined so far: {have}); "
                f"name it in gen(...) or select(...) before reading it")


class BackendError(LangError, RuntimeError):
    """The backend failed to serve a request."""


class BackendUnavailableError(BackendError):
    """The backend cannot be reached or is not running (server down, engine died)."""


class RequestRejectedError(BackendError, ValueError):
    """The backend refused a request as invalid (bad sampling parameter, bad regex, ...)."""


class UnsupportedByBackendError(LangError, NotImplementedError):
    """The program asked for something this backend cannot do (e.g. select without logprobs)."""
