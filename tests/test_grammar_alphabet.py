"""Static grammar masks (constrained/alphabet.py): the tokens a grammar can never accept, from
the characters its terminals can match. They must never ban a token the grammar accepts in some
state (checked against xgrammar's own masks along random walks), and they must ban what they
promise (a newline under a letters-only regex), so that optimistic sampling stops losing steps to
rejections of such tokens."""

from __future__ import annotations

import json
import random

import pytest
import torch

from radixlm.constrained.alphabet import ascii_alphabet


def _chars(alphabet) -> set[str]:
    return set(map(chr, alphabet))


@pytest.fixture(scope="module")
def backend(tokenizer):
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    b = XGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield b
    b.shutdown()


def _alphabet(backend, kind: str, spec: str):
    from radixlm.constrained.base import ConstraintKey
    grammar = backend.compile(ConstraintKey(kind, spec)).result().grammar
    return ascii_alphabet(grammar.grammar.serialize_json())


@pytest.mark.parametrize("kind,spec,chars", [
    ("ebnf", r'root ::= "ab\"\\" [x-z0-1]', 'ab"\\xyz01'),
    # xgrammar prints these two wrong (`[^a-c]`, and "a" cut at the NUL): the serialized form
    # is read instead.
    ("ebnf", r"root ::= [\^a-c]+", "^abc"),
    ("ebnf", r'root ::= "a\x00zq"', "a\x00zq"),
    ("ebnf", r"root ::= [\x5e-\x60]+", "^_`"),
    ("regex", r"(yes|no)\t[0-9]{2,3}", "yesno\t0123456789"),
])
def test_the_alphabet_is_the_characters_of_the_terminals(backend, kind, spec, chars):
    assert _chars(_alphabet(backend, kind, spec)) == set(chars)


def test_negated_classes_and_constructs_not_read(backend):
    negated = _alphabet(backend, "ebnf", r'root ::= [^\0-\x1f"\\]+')
    assert negated == frozenset(range(32, 128)) - {ord('"'), ord("\\")}
    assert _alphabet(backend, "regex", ".+") == frozenset(range(128))
    # A JSON schema's pattern is an inline regex, a structural tag's triggers any text: no
    # alphabet (no static mask) rather than a wrong one.
    pattern = json.dumps({"type": "object", "properties": {"z": {"type": "string",
                                                                  "pattern": "^[0-9]{5}$"}}})
    assert _alphabet(backend, "json_schema", pattern) is None
    tag = json.dumps({"structures": [{"begin": "<f>", "schema": {"type": "object"},
                                      "end": "</f>"}], "triggers": ["<f>"]})
    assert _alphabet(backend, "structural_tag", tag) is None
    assert ascii_alphabet("not json") is None
    assert ascii_alphabet(json.dumps({"grammar_expr_data": [0, 5, 97],
                                      "grammar_expr_indptr": [0, 3]})) is None   # bad layout


GRAMMARS = [
    ("regex", r"[a-zA-Z ,.]+"),
    ("regex", r"\d{3}-\d{4} [a-z]{2,6}"),
    ("regex", r"(\d{3}-)?[^x\n]{2,5}\.(foo|bar)"),
    ("json_schema", json.dumps({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "tags": {"type": "array", "items": {"enum": ["a b", "c\td"]}},
                       "n": {"type": "number"}},
        "required": ["name", "n"]})),
    ("json_schema", json.dumps({"type": "object"})),
    ("ebnf", 'root ::= "yes" | "no" | [0-9]+ "!"'),
    # What an independent probe found the printed form got wrong.
    ("ebnf", r"root ::= ([\^a-z ] | [0-9,.])+"),
    ("ebnf", r'root ::= "a" ("\x00zq" | "-")'),
    ("regex", r"[\x5e-\x60 ]+"),
]


def _allowed(mask_row: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = (mask_row.view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.view(-1)[:vocab].bool()


@pytest.mark.parametrize("kind,spec", GRAMMARS)
def test_static_mask_never_bans_a_token_the_grammar_accepts(backend, tokenizer, kind, spec):
    from radixlm.constrained.base import ConstraintKey
    vocab = len(tokenizer)
    compiled = backend.compile(ConstraintKey(kind, spec)).result()
    static = backend.static_masks([compiled.static_mask_row], torch.device("cpu"))
    assert static is not None, "every grammar here has characters it never matches"
    statically_allowed = _allowed(static[0], vocab)
    assert statically_allowed[tokenizer.eos_token_id]           # stop tokens stay
    rng = random.Random(0)
    for walk in range(4):
        matcher = backend.matcher(compiled)
        for _ in range(24):
            mask = backend.allocate_mask(1)
            matcher.fill_vocab_mask(mask, 0)
            allowed = _allowed(mask[0], vocab)
            assert not (allowed & ~statically_allowed).any(), \
                (walk, tokenizer.convert_ids_to_tokens(
                    (allowed & ~statically_allowed).nonzero().view(-1)[:5].tolist()))
            choices = [t for t in allowed.nonzero().view(-1).tolist()
                       if t != tokenizer.eos_token_id]
            if not choices or matcher.is_terminated():
                break
            assert matcher.accept_token(rng.choice(choices))


def test_static_mask_bans_tokens_outside_the_alphabet(backend, tokenizer):
    from radixlm.constrained.base import ConstraintKey
    compiled = backend.compile(ConstraintKey("regex", r"[a-zA-Z ,.]+")).result()
    static = backend.static_masks([0, compiled.static_mask_row], torch.device("cpu"))
    free, letters = (_allowed(row, len(tokenizer)) for row in static)
    assert free.all()                                          # row 0: no mask
    for text in ["\n", "'s", "2", "(", " the", " Sea", ","]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, text
        assert bool(letters[ids[0]]) == all(c.isalpha() or c in " ,." for c in text), text
    # Grammars with the same characters share a row.
    again = backend.compile(ConstraintKey("regex", r"[a-zA-Z ,.]{2,}")).result()
    assert again.static_mask_row == compiled.static_mask_row


def _lowercase_prose(optimistic: bool) -> tuple[list[list[int]], int]:
    """Greedy chat answers under `[a-z ]+` through a Scheduler in this process (plain loop,
    CPU): outputs and grammar rejections. The model keeps asking for capitals, commas and
    full stops, which that regex never accepts."""
    from helpers import cpu_scheduler, submit_and_wait_for_grammars
    from radixlm.config import ServerArgs
    from radixlm.model_executor.weight_source import load_tokenizer
    from radixlm.sampling.params import SamplingParams

    args = ServerArgs(device="cpu", max_total_tokens=2048, disable_overlap_schedule=True,
                      disable_optimistic_grammar=not optimistic)
    sched = cpu_scheduler(args, lambda m: None, load_tokenizer=load_tokenizer)
    params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 20,
                                       "min_new_tokens": 20, "regex": "[a-z ]+"})
    prompts = [sched.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a few sentences about {topic}."}],
        tokenize=False, add_generation_prompt=True)
        for topic in ["the sea", "autumn", "a train journey"]]
    reqs = submit_and_wait_for_grammars(sched, [(p, params) for p in prompts])
    while sched.has_work:
        sched.step()
    return [r.output_ids for r in reqs], sched.grammar_rejections


def test_static_masks_stop_the_rejections_they_cover(monkeypatch):
    """With static masks, tokens outside the alphabet are never drawn, so none is rejected;
    without them (row 0 for every grammar) the same requests see rejections. The outputs are
    masked sampling's either way."""
    from radixlm.constrained.alphabet import StaticMaskTable
    # (xgrammar's host matchers: as a token automaton the regex is masked exactly, on the device)
    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")
    masked, _ = _lowercase_prose(optimistic=False)
    with_static, rejections = _lowercase_prose(optimistic=True)
    monkeypatch.setattr(StaticMaskTable, "row_for", lambda self, alphabet: 0)
    without, rejections_without = _lowercase_prose(optimistic=True)
    assert with_static == masked and without == masked
    assert rejections_without > 0
    assert rejections == 0


def test_static_masks_of_a_repeated_batch_are_gathered_once(backend):
    """A decode batch asks for the same rows step after step: the gathered masks are reused
    (no host-to-device copy a step), and a changed batch gets its own."""
    from radixlm.constrained.base import ConstraintKey
    row = backend.compile(ConstraintKey("regex", r"[a-z]+")).result().static_mask_row
    cpu = torch.device("cpu")
    first = backend.static_masks([row, 0, row], cpu)
    assert backend.static_masks([row, 0, row], cpu) is first
    other = backend.static_masks([0, row], cpu)
    assert other is not first and torch.equal(other[1], first[0])
    assert backend.static_masks([0, 0], cpu) is None
