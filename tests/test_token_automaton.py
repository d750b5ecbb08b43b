"""Regular grammars as token automata (constrained/byte_automaton.py, token_automaton.py),
checked against xgrammar's own matcher on the bundled tokenizer: along random walks, each state's
mask must be xgrammar's bit for bit, the same tokens accepted, the same end, and the forced text
(jump-forward) a prefix of every continuation. Grammars that are not regular (nesting, JSON's
lookaheads) must stay on xgrammar."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from radixlm.constrained.base import ConstraintKey


@pytest.fixture(scope="module")
def backend(tokenizer):
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    b = XGrammarBackend(tokenizer, len(tokenizer) + 7, [tokenizer.eos_token_id])
    yield b
    b.shutdown()


def _compiled(backend, kind: str, spec: str):
    return backend.compile(ConstraintKey(kind, spec)).result()


REGULAR = [
    ("regex", r"[a-zA-Z ,.]+"),
    ("regex", r"(yes|no)\t[0-9]{2,3}"),
    ("regex", r"[A-Z][a-z]+ (is|was) [0-9]+(\.[0-9]+)?"),
    ("regex", r"\d{3}-\d{3}-\d{4}"),
    ("regex", r"[^a-z\n]{1,6}!"),          # negated: every non-ASCII character too
    ("regex", r"(ab)*c?é+"),
    ("regex", r".{0,5}"),
    ("ebnf", 'root ::= "The answer is " ("yes" | "no") "."'),
    ("ebnf", 'root ::= "(" item ")"\nitem ::= [0-9] item | [0-9]'),
]


@pytest.mark.parametrize("kind,spec", REGULAR)
def test_masks_and_steps_are_xgrammar_s_along_random_walks(backend, kind, spec):
    import xgrammar as xgr
    compiled = _compiled(backend, kind, spec)
    assert compiled.automaton is not None, "a regular grammar should compile to an automaton"
    rng = random.Random(hash(spec) % 1000)
    words = (backend.vocab_size + 31) // 32
    for _walk in range(4):
        ours, theirs = backend.matcher(compiled), xgr.GrammarMatcher(compiled.grammar)
        for _ in range(24):
            want = xgr.allocate_token_bitmask(1, backend.vocab_size)
            theirs.fill_next_token_bitmask(want, 0)
            got = torch.zeros((1, words), dtype=torch.int32)
            ours.fill_vocab_mask(got, 0)
            bits_want = np.unpackbits(want.numpy().view(np.uint8), bitorder="little")
            bits_got = np.unpackbits(got.numpy().view(np.uint8), bitorder="little")
            n = backend.vocab_size
            # (ids past the tokenizer's are padding: xgrammar bans them; so must we)
            differ = np.flatnonzero(bits_want[:n] != bits_got[:n])
            assert differ.size == 0, (spec, differ[:10].tolist())
            allowed = np.flatnonzero(bits_want[:n])
            assert allowed.size, spec
            forced = ours.find_jump_forward_string()
            assert forced == theirs.find_jump_forward_string() or forced == ""
            # A banned token is refused by both, and leaves the state alone.
            banned = np.flatnonzero(bits_want[:n] == 0)
            if banned.size:
                assert not ours.accept_token(int(rng.choice(banned)))
            token = int(rng.choice(allowed))
            assert ours.accept_token(token) and theirs.accept_token(token)
            assert ours.is_terminated() == theirs.is_terminated()
            if rng.random() < 0.2:          # rollback, as jump-forward does
                ours.rollback(1)
                theirs.rollback(1)
            if ours.is_terminated():
                break


def test_forced_text_is_what_jump_forward_gets(backend):
    m = backend.matcher(_compiled(backend, "ebnf",
                                  'root ::= "The answer is " ("yes" | "no") "."'))
    assert m.find_jump_forward_string() == "The answer is "
    m2 = backend.matcher(_compiled(backend, "regex", r"\{\"name\": \"[a-z]+\"\}"))
    assert m2.find_jump_forward_string() == '{"name": "'


@pytest.mark.parametrize("kind,spec", [
    ("ebnf", 'root ::= "(" root ")" | "x"'),                  # nesting: not regular
    ("json_schema", json.dumps({"type": "object",
                                "properties": {"a": {"type": "integer"}}})),
])
def test_grammars_that_are_not_regular_stay_on_xgrammar(backend, kind, spec):
    from radixlm.constrained.xgrammar_backend import XGrammarMatcher
    compiled = _compiled(backend, kind, spec)
    assert compiled.automaton is None
    assert isinstance(backend.matcher(compiled), XGrammarMatcher)


def test_device_tables_hold_global_states(backend):
    """Global state 0 allows every token and stays 0; an automaton's rows follow its base."""
    compiled = _compiled(backend, "regex", r"[0-9]+")
    table = backend.automata_table()
    nxt, allowed = table.tables(torch.device("cpu"))
    assert bool((allowed[0] == -1).all()) and bool((nxt[0] == 0).all())
    m = backend.matcher(compiled)
    base = compiled.device_base
    assert base is not None and m.device_state() == base
    seven = next(t for t in range(compiled.automaton.next_state.shape[1])
                 if compiled.automaton.next_state[0, t] >= 0)
    assert m.accept_token(seven)
    assert int(nxt[base, seven]) == m.device_state()
    assert torch.equal(allowed[m.device_state()], compiled.automaton.allowed[m.state])


def test_walking_class_sequences_gives_every_tokens_walk(backend, monkeypatch):
    """Past a few states the tokens are walked once per byte-class sequence (each the same
    for every token of it): the tables equal those of walking every token, for ASCII and
    Unicode classes."""
    import xgrammar as xgr

    from radixlm.constrained import token_automaton as ta
    from radixlm.constrained.byte_automaton import byte_dfa
    vocab = ta.VocabBytes(backend._decoded_vocab, backend.vocab_size)
    for spec in (r"[a-z]{0,12}-\d{2,4}", r"[\w ]{1,9}\.", r"(ab)*c?é+x{3}"):
        dfa = byte_dfa(xgr.Grammar.from_regex(spec).serialize_json())
        assert dfa.num_states > ta.WALK_STATES, spec
        args = (dfa, vocab, backend._stop_ids, sorted(backend._never))
        by_class = ta.token_automaton(*args)
        with monkeypatch.context() as m:
            m.setattr(ta, "WALK_STATES", dfa.num_states)    # every token walked
            every = ta.token_automaton(*args)
        assert np.array_equal(by_class.next_state, every.next_state), spec
        assert torch.equal(by_class.allowed, every.allowed), spec
