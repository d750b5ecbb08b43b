"""Backends a program can run on."""

from radixlm.lang.backends.base import Backend

__all__ = ["Backend"]
