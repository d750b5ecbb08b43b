"""Structured outputs on the bundled model: JSON schema, regex and EBNF constraints, sampled at
temperature 1 with many seeds; every output that finished with `stop` must satisfy its
constraint. Jump-forward on and off."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

SEEDS = range(6)

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "address": {"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 12},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]},
        },
        "required": ["name", "address"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    "enum_and_optional": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "shade": {"type": "string", "maxLength": 10}},
        "required": ["color"],
    },
    "numbers": {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["age", "score"],
    },
    "ref_and_anyof": {
        "$defs": {"point": {"type": "object",
                            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"},
                       "label": {"anyOf": [{"type": "string", "maxLength": 8},
                                           {"type": "null"}]}},
        "required": ["start", "label"],
    },
}

REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"(yes|no|maybe)", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
           r"\d{4}-\d{2}-\d{2}"]

EBNF = """
root ::= sentence "."
sentence ::= subject " " verb " " object
subject ::= "The cat" | "A dog" | "My friend"
verb ::= "eats" | "sees" | "likes"
object ::= "fish" | "the ball" | "a tree"
"""


@pytest.fixture(scope="module")
def engine():
    from radixlm.entrypoints.engine import Engine
    e = Engine(device="cpu", log_level="warning", max_total_tokens=16384)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def engine_no_jf():
    from radixlm.entrypoints.engine import Engine
    e = Engine(device="cpu", log_level="warning", max_total_tokens=8192,
               disable_jump_forward=True)
    yield e
    e.shutdown()


def _chat(engine, text: str) -> str:
    return engine.apply_chat_template([{"role": "user", "content": text}])


def _sample(engine, prompt: str, constraint: dict, max_new_tokens: int = 96) -> list[dict]:
    params = [{"max_new_tokens": max_new_tokens, "temperature": 1.0, "sampling_seed": s,
               **constraint} for s in SEEDS]
    return engine.generate([prompt] * len(params), params)


def _stopped(outs: list[dict]) -> list[dict]:
    done = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert len(done) >= len(outs) // 2, [o["meta_info"]["finish_reason"] for o in outs]
    return done


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_outputs_validate(engine, name):
    schema = SCHEMAS[name]
    prompt = _chat(engine, f"Reply with a JSON object for this schema: {json.dumps(schema)}")
    for out in _stopped(_sample(engine, prompt, {"json_schema": json.dumps(schema)})):
        jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_match(engine, pattern):
    outs = _sample(engine, "Answer: ", {"regex": pattern}, max_new_tokens=32)
    for out in _stopped(outs):
        assert re.fullmatch(pattern, out["text"]), out["text"]


def test_ebnf_outputs_parse(engine):
    sentence = re.compile(r"(The cat|A dog|My friend) (eats|sees|likes) (fish|the ball|a tree)\.")
    for out in _stopped(_sample(engine, "Write a sentence: ", {"ebnf": EBNF}, 32)):
        assert sentence.fullmatch(out["text"]), out["text"]


ANSWER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                "days": {"type": "integer"}},
                 "required": ["city", "days"], "additionalProperties": False}


def test_structural_tag_outputs(engine):
    """structural_tag in xgrammar's form (a tag that must be written) and in SGLang's
    (free text; a trigger starts a structure whose body follows its schema)."""
    forced = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<answer>", "content": {"type": "json_schema",
                                                         "json_schema": ANSWER_SCHEMA},
        "end": "</answer>"}}
    prompt = _chat(engine, "Which city, and for how many days?")
    for out in _stopped(_sample(engine, prompt, {"structural_tag": json.dumps(forced)}, 64)):
        body = re.fullmatch(r"<answer>(.*)</answer>", out["text"], re.S)
        assert body, out["text"]
        jsonschema.validate(json.loads(body.group(1)), ANSWER_SCHEMA)
    with pytest.raises(ValueError, match="structural_tag"):
        engine.generate("x", {"max_new_tokens": 2, "structural_tag": json.dumps(
            {"type": "structural_tag", "triggers": ["<a>"]})})


def test_constrained_and_free_requests_in_one_batch(engine):
    prompts = ["Answer: ", "Tell me something: ", "Answer: "]
    params = [{"max_new_tokens": 16, "temperature": 0, "regex": r"(yes|no)"},
              {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
              {"max_new_tokens": 16, "temperature": 0, "regex": r"\d{3}"}]
    outs = engine.generate(prompts, params)
    assert outs[0]["text"] in ("yes", "no")
    assert len(outs[1]["output_ids"]) == 8
    assert re.fullmatch(r"\d{3}", outs[2]["text"])


def test_jump_forward_on_and_off(engine, engine_no_jf):
    schema = SCHEMAS["enum_and_optional"]
    prompt = _chat(engine, "Pick a colour and describe its shade as JSON.")
    for e in (engine, engine_no_jf):
        for out in _stopped(_sample(e, prompt, {"json_schema": json.dumps(schema)})):
            jsonschema.validate(json.loads(out["text"]), schema)
    # Where the forced pieces are whole words that the tokenizer encodes exactly as greedy
    # constrained decoding picks them, jump-forward changes nothing but the number of steps.
    prompt = _chat(engine, "Is the sky blue? Reply in JSON.")
    params = {"max_new_tokens": 40, "temperature": 0, "regex": r"The answer is (yes|no)\."}
    on, off = engine.generate(prompt, params), engine_no_jf.generate(prompt, params)
    assert on["output_ids"] == off["output_ids"] and on["text"] == "The answer is no."
    # Here the jumped text is tokenized naturally ('{"answer": "' in fewer, larger tokens than
    # the constrained path samples one by one): same text, different (fewer) tokens.
    params = {"max_new_tokens": 40, "temperature": 0, "regex": r'\{"answer": "(yes|no)"\}'}
    on, off = engine.generate(prompt, params), engine_no_jf.generate(prompt, params)
    assert on["text"] == off["text"]
    assert len(on["output_ids"]) < len(off["output_ids"])
    # Retokenization legitimately changes later choices when the forced text merges with the
    # sampled one differently (e.g. 'Answer: ' as one natural token sequence vs ':' and ' '
    # sampled separately): the model then sees other tokens and may continue differently.


def test_constraints_with_streaming_n_and_logprobs(engine):
    chunks = list(engine.generate("Answer: ", {"max_new_tokens": 16, "temperature": 0,
                                               "regex": r"\d{3}-\d{3}"}, stream=True))
    assert re.fullmatch(r"\d{3}-\d{3}", chunks[-1]["text"])
    outs = engine.generate("Answer: ", {"max_new_tokens": 16, "temperature": 1.0, "n": 3,
                                        "sampling_seed": 3, "regex": r"[a-z]{4}"})
    assert all(re.fullmatch(r"[a-z]{4}", o["text"]) for o in outs)
    lp = engine.generate("Answer: ", {"max_new_tokens": 16, "temperature": 0,
                                      "regex": r"\d{2}"}, return_logprob=True)
    assert re.fullmatch(r"\d{2}", lp["text"])
    assert len(lp["meta_info"]["output_token_logprobs"]) == len(lp["output_ids"])


@pytest.mark.parametrize("params, needle", [
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nope"}}})},
     "json_schema"),
    ({"regex": "(unclosed"}, "regex"),
    ({"ebnf": "root ::= undefined_rule"}, "ebnf"),
    ({"regex": "a", "json_schema": "{}"}, "only one of"),
])
def test_invalid_constraints_raise_and_engine_keeps_serving(engine, params, needle):
    with pytest.raises(ValueError, match=needle) as e:
        engine.generate("x", {"max_new_tokens": 4, **params})
    assert ".cc:" not in str(e.value)      # the compiler's reason, not its source location
    assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] >= 1


def test_grammar_backend_none_rejects_constraints(make_engine):
    e = make_engine(grammar_backend="none", max_total_tokens=1024)
    with pytest.raises(ValueError, match="grammar-backend"):
        e.generate("x", {"max_new_tokens": 4, "regex": "a+"})


def test_structural_tag_with_triggers_holds_only_the_structures(tokenizer):
    """SGLang's form: any text, until a trigger opens a structure, whose body must follow its
    schema up to the end tag; then free text again."""
    from radixlm.constrained.base import ConstraintKey
    from radixlm.constrained.xgrammar_backend import XGrammarBackend

    backend = XGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    tag = {"type": "structural_tag", "triggers": ["<answer>"], "structures": [
        {"begin": "<answer>", "schema": ANSWER_SCHEMA, "end": "</answer>"}]}
    compiled = backend.compile(ConstraintKey("structural_tag", json.dumps(tag))).result()

    def accepts(text: str) -> bool:
        matcher = backend.matcher(compiled)
        return all(matcher.accept_token(t) for t in tokenizer.encode(text))

    assert accepts('Sure. <answer>{"city": "Oslo", "days": 2}</answer> Enjoy!')
    assert accepts("Just text, no structure at all.")
    assert not accepts('Sure. <answer>{"city": "Oslo"}</answer>')         # days missing
    assert not accepts('Sure. <answer>{"city": "Oslo", "days": "two"}</answer>')
    backend.shutdown()


@pytest.mark.parametrize("threads", [1, 3])
def test_batched_mask_fill_equals_per_matcher_fill(tokenizer, monkeypatch, threads):
    """The scheduler fills a step's grammar masks with one batched (multi-threaded) call; every
    row, including rows left out, must equal what filling matcher by matcher gives."""
    from radixlm.constrained.base import ConstraintKey
    from radixlm.constrained.xgrammar_backend import XGrammarBackend

    monkeypatch.setenv("RADIXLM_GRAMMAR_FILL_THREADS", str(threads))
    monkeypatch.setenv("RADIXLM_DISABLE_GRAMMAR_AUTOMATA", "1")   # (xgrammar's matchers)
    backend = XGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    assert backend.fill_threads == threads
    keys = [ConstraintKey("json_schema", json.dumps(SCHEMAS["nested"])),
            ConstraintKey("regex", r"[a-z]{2,5}-[0-9]+"), ConstraintKey("regex", r"(yes|no)")]
    prefixes = ['{"name": "Al', "ab", ""]
    matchers = []
    for key, prefix in zip(keys * 3, prefixes * 3):
        m = backend.matcher(backend.compile(key).result())
        for t in tokenizer.encode(prefix, add_special_tokens=False):
            assert m.accept_token(t)
        matchers.append(m)
    rows = [0, 2, 3, 5, 6, 8, 9, 10, 11]          # rows 1, 4, 7 are left all-allowed
    batched = backend.allocate_mask(12)
    backend.fill_vocab_masks(matchers, batched, rows)
    serial = backend.allocate_mask(12)
    for m, r in zip(matchers, rows):
        m.fill_vocab_mask(serial, r)
    assert torch.equal(batched, serial)
    assert torch.equal(batched[1], backend.allocate_mask(1)[0])   # untouched row
    assert not torch.equal(batched[0], batched[1])                # a filled row differs
    backend.shutdown()


def test_fill_timer_keeps_the_faster_way_and_keeps_checking():
    """Automatic mask filling: serial first, threaded once, then whichever is faster per row,
    with the other tried again every EXPLORE_EVERY fills (the mix of grammars changes); fills
    whose serial cost is below min_threaded_fill_s never try threads."""
    from radixlm.constrained.xgrammar_backend import FillTimer

    def run(timer, serial_s, threaded_s, n, rows=200):
        picks = []
        for _ in range(n):
            threaded = timer.pick_threaded(rows)
            picks.append(threaded)
            timer.record(threaded, threaded_s if threaded else serial_s)
        return picks

    cheap = FillTimer()   # a simple regex: threads only add hand-off cost
    picks = run(cheap, 10e-6, 30e-6, 200)
    assert picks[:2] == [False, True]
    assert sum(picks[2:]) == len([c for c in range(3, 201) if c % FillTimer.EXPLORE_EVERY == 0])
    costly = FillTimer()  # bounded JSON strings: threads pay off
    picks = run(costly, 400e-6, 80e-6, 200)
    assert picks[:2] == [False, True]
    assert sum(not p for p in picks[2:]) == len([c for c in range(3, 201)
                                                 if c % FillTimer.EXPLORE_EVERY == 0])
    # The served grammars change: serial gets cheap, and the next exploration switches back.
    picks = run(costly, 50e-6, 80e-6, 2 * FillTimer.EXPLORE_EVERY)
    assert sum(picks[-FillTimer.EXPLORE_EVERY:]) == 1   # serial again, threaded only to explore
    # ... and once a serial fill of the batch is cheaper than waking threads, none are tried.
    picks = run(costly, 5e-6, 80e-6, 4 * FillTimer.EXPLORE_EVERY, rows=64)
    assert not any(picks[FillTimer.EXPLORE_EVERY:])
    tiny = FillTimer()
    assert not any(run(tiny, 10e-6, 30e-6, 200, rows=64)[1:])
    fixed = FillTimer(explore=False)
    assert all(run(fixed, 1e-6, 1e-3, 10))


def test_prompt_is_shared_when_the_first_step_jumps(engine):
    """Requests with one long prompt: the first is prefilled alone (the others wait to share
    its prefix) and jumps forward right after its first token; its prompt must still go into
    the radix cache then, or every other request waits again and computes it anew."""
    prompt = _chat(engine, "Is the sky blue? " * 12 + "Reply in JSON.")
    params = {"max_new_tokens": 40, "temperature": 0, "regex": r'\{"answer": "(yes|no)"\}'}
    outs = engine.generate([prompt] * 3, [params] * 3)
    prompt_tokens = outs[0]["meta_info"]["prompt_tokens"]
    assert prompt_tokens > 64
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    # The first computes the prompt (the engine's cache may hold the chat template's head);
    # the other two find all of it but the last token in the cache.
    assert cached[0] < prompt_tokens - 32 and cached[1] == cached[2] == prompt_tokens - 1, cached
    assert all(o["text"] == outs[0]["text"] for o in outs)
