"""A regex class that opens with an escaped caret (`[\\^a-z]`) means "a caret or ...": xgrammar's
converter reads it as negation, so constrained/regex_caret.py respells such classes before they
are compiled. Checked against Python's `re` on the same regexes, and through the backend (the
static mask must not ban the caret either)."""

from __future__ import annotations

import re

import pytest

from radixlm.constrained.regex_caret import protect_leading_caret

xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

SAMPLES = ["^", "a", "z", "_", "`", "1", "-", "]", "[", "b", "x^y", "x]y", "[^a]", "^^a"]


@pytest.mark.parametrize("regex", [
    r"[\^a-z]+", r"[\^]+", r"[\^-a]+", r"[\^\^a]+", r"[\^^a]+", r"[\^-]+", r"x[\^\]]y",
    r"[\^a-]+", r"(?:[\^a]|b)+",
    # unaffected spellings stay as written
    r"[a\^]+", r"[^\^a]+", r"\[\^a]", r"[[\^a]+", r"\^[a-z]",
])
def test_the_respelt_regex_matches_what_python_matches(regex):
    grammar = xgr.Grammar.from_regex(protect_leading_caret(regex))
    wrong = [s for s in SAMPLES if accepts(grammar, s) != bool(re.fullmatch(regex, s))]
    assert wrong == []


def test_only_classes_opening_with_an_escaped_caret_are_rewritten():
    assert protect_leading_caret(r"[\^a-z]") == r"(?:\^|[a-z])"
    assert protect_leading_caret(r"[\^]") == r"\^"
    for unchanged in (r"[a\^]", r"[^\^]", r"\[\^]", r"[\]\^]", r"a\^b", r"[\^"):
        assert protect_leading_caret(unchanged) == unchanged


def test_the_backend_accepts_the_caret(tokenizer):
    from radixlm.constrained.base import ConstraintKey
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    backend = XGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    try:
        compiled = backend.compile(ConstraintKey("regex", r"[\^a-z]{3}")).result()
        matcher = backend.matcher(compiled)
        caret = tokenizer.encode("^", add_special_tokens=False)
        assert len(caret) == 1
        assert matcher.accept_token(caret[0])
        digit = tokenizer.encode("1", add_special_tokens=False)
        assert not matcher.accept_token(digit[0])
    finally:
        backend.shutdown()
