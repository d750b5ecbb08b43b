"""Speculative decoding with trees of drafts (issue 18): NGRAM proposes the continuations of
several earlier occurrences merged into a tree (--speculative-ngram-max-bfs-breadth > 1), one
decode step verifies every node with a per-row tree mask, and the accepted path's KV slots are
renumbered into place. The tree pieces in isolation, then whole engines on the bundled model,
whose outputs must be token for token those of the engine without speculation. (The attention
masks themselves are checked against a dense softmax in test_triton_attention.py.)"""

from __future__ import annotations

import pytest

from helpers import assert_pool_empty
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.request import Req
from radixlm.scheduler.speculation import NgramDrafter, Speculator
from radixlm.speculative.ngram import DraftTree, NgramIndex, weighted_tree

# ---------------------------------------------------------------------- trees


def test_tree_is_the_best_chain_then_the_other_candidates_branches():
    # Candidates best first: the first two share "1 2", the third starts elsewhere.
    tree = weighted_tree([[1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9]], max_nodes=8, min_breadth=1,
                         max_breadth=3)
    # The best candidate's chain first; "5" is refused (depth 2 allows one child); then the
    # third candidate's branch.
    assert tree.tokens == [1, 2, 3, 4, 7, 8, 9]
    assert tree.parents == [0, 1, 2, 3, 0, 5, 6]
    assert tree.depths() == [0, 1, 2, 3, 4, 1, 2, 3]
    assert tree.path_tokens(4) == [1, 2, 3, 4] and tree.path_tokens(7) == [7, 8, 9]
    assert tree.main_chain() == DraftTree.chain([1, 2, 3, 4])
    bits = tree.ancestor_bits()
    assert bits[0] == 0b1 and bits[4] == 0b11111 and bits[7] == 0b11100001
    assert not tree.is_chain and DraftTree.chain([4, 5]).is_chain
    # A budget the best chain fills leaves no branch: the tree is that chain.
    assert weighted_tree([[1, 2, 3, 4], [5, 6]], 3, 1, 3) == DraftTree.chain([1, 2, 3])
    # Later candidates that agree outweigh one that stands alone (but never the first).
    assert weighted_tree([[1], [7, 8], [9], [7, 8]], 4, 1, 3).tokens == [1, 7, 8, 9]
    # min_breadth keeps branching below the root.
    wide = weighted_tree([[1, 2], [1, 3], [1, 4]], 8, 2, 2)
    assert wide.tokens == [1, 2, 3] and wide.parents == [0, 1, 1]
    # One candidate is a chain, whatever the breadth.
    assert weighted_tree([[5, 6, 7]], 8, 1, 4) == DraftTree.chain([5, 6, 7])


def test_index_gives_continuations_of_several_occurrences():
    text = [5, 1, 2, 5, 1, 3, 5, 1, 4, 5]
    ix = NgramIndex(1, 3, occurrences=3)
    # "5" (and "4 5" never seen before): the three occurrences of 5, latest first.
    assert ix.candidates(text, 3, 4) == [[1, 4, 5], [1, 3, 5], [1, 2, 5]]
    assert ix.candidates(text, 3, 1) == [[1, 4, 5]] == [NgramIndex(1, 3).propose(text, 3)]
    text += [1]      # "5 1" matches with window 2 at the same three places: no duplicates
    assert ix.candidates(text, 2, 8) == [[4, 5], [3, 5], [2, 5]]


def _req() -> Req:
    return Req("r", [1, 2, 3], SamplingParams(max_new_tokens=64, temperature=0.0), seed=0)


def test_accept_walks_the_tree_and_names_the_rows():
    spec, req = Speculator(NgramDrafter(1, 4, 1, 3), 8), _req()
    # root -> a(1) -> b(3) ; root -> c(2) -> d(4) -> e(5)
    req.spec_drafts, req.spec_parents = [10, 20, 11, 21, 22], [0, 0, 1, 2, 4]
    # The target picks 20 after the root, 21 after c, 22 after d, 9 after e: all of c d e.
    targets = [20, 11, 21, 99, 22, 9]
    assert spec.accept_rows(req, targets) == ([20, 21, 22, 9], [0, 2, 4, 5])
    assert req.spec_drafts == [] and req.spec_parents is None
    req.spec_drafts, req.spec_parents = [10, 20, 11, 21, 22], [0, 0, 1, 2, 4]
    assert spec.accept_rows(req, [10, 12, 0, 0, 0, 0]) == ([10, 12], [0, 1])
    req.spec_drafts, req.spec_parents = [10, 20, 11, 21, 22], [0, 0, 1, 2, 4]
    assert spec.accept_rows(req, [7, 0, 0, 0, 0, 0]) == ([7], [0])
    t = spec.totals
    assert (t.verify_steps, t.proposed) == (3, 15)


def test_plan_drafts_trees_where_breadth_allows():
    spec = Speculator(NgramDrafter(1, 3, 1, 3), 8)
    req = _req()
    req.output_ids = [9, 1, 4, 9, 1, 5, 9]       # "9" was followed by "1 4" and by "1 5"
    assert spec.plan([req], 100, None, 512) > 0
    assert req.spec_parents is not None
    tree = DraftTree(req.spec_drafts, req.spec_parents)
    assert [1, 5, 9] in [tree.path_tokens(j) for j in range(len(tree) + 1)]
    assert [1, 4, 9] in [tree.path_tokens(j)[:3] for j in range(len(tree) + 1)]
    # The same text as a chain (breadth 1): the latest occurrence's continuation only.
    chain = Speculator(NgramDrafter(1, 3), 8)
    req2 = _req()
    req2.output_ids = list(req.output_ids)
    chain.plan([req2], 100, None, 512)
    assert req2.spec_parents is None and req2.spec_drafts[:2] == [1, 5]


def test_tree_flags_are_checked():
    from radixlm.config import ServerArgs
    ok = dict(speculative_algorithm="NGRAM", speculative_ngram_max_bfs_breadth=4)
    ServerArgs(**ok)
    for kwargs, flag in [
            ({"speculative_ngram_max_bfs_breadth": 4}, "--speculative-algorithm"),
            ({**ok, "page_size": 16}, "--page-size"),
            ({**ok, "speculative_num_draft_tokens": 63}, "--speculative-num-draft-tokens"),
            ({**ok, "enable_torch_compile": True}, "--enable-torch-compile"),
            ({**ok, "speculative_ngram_min_bfs_breadth": 5}, "--speculative-ngram-max-bfs"),
            ({**ok, "speculative_ngram_max_bfs_breadth": 0}, "--speculative-ngram-max-bfs")]:
        with pytest.raises(ValueError, match=flag):
            ServerArgs(**kwargs)


# ---------------------------------------------------------------------- engines

COPY = ("Repeat this list exactly: red apple, red car, red door, blue apple, blue car, blue "
        "door, green apple, green car. Repeat: red apple, red car, red door, blue")
CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n")
TREE = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8,
            speculative_ngram_max_bfs_breadth=3)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_tree_outputs_equal_the_engine_without_speculation(make_engine, monkeypatch,
                                                           overlap):
    """Greedy, sampled (same seeds), penalised and logprob requests in one batch, with a stop
    string: tokens, logprobs and finish reasons equal the engine without drafts; no KV slot is
    left behind."""
    if overlap:
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    base = {"max_new_tokens": 32}
    prompts = [COPY, CODE, COPY, CODE, "The capital of France is"]
    params = [{**base, "temperature": 0},
              {**base, "temperature": 0, "stop": ["div"]},
              {**base, "temperature": 0.8, "sampling_seed": 3},
              {**base, "temperature": 0.7, "top_k": 20, "frequency_penalty": 0.3,
               "sampling_seed": 5},
              {**base, "temperature": 0}]
    outs, stats = {}, {}
    for spec in (False, True):
        engine = make_engine(max_total_tokens=4096, **(TREE if spec else {}))
        outs[spec] = engine.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
        stats[spec] = engine.get_stats()
        assert_pool_empty(engine)
        engine.shutdown()
    for a, b in zip(outs[False], outs[True]):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert [lp for lp, _, _ in lb] == pytest.approx([lp for lp, _, _ in la], abs=1e-4)
        ta, tb = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
        assert [[tok for _, tok, _ in t] for t in tb] == [[tok for _, tok, _ in t] for t in ta]
    assert sum(o["meta_info"]["spec_verify_ct"] > 0 for o in outs[True]) >= 3
    assert stats[True].spec_accept_length > 1.2, stats[True]


@pytest.mark.parametrize("trees", [False, True], ids=["chains", "trees"])
def test_abort_all_during_verify_steps_frees_every_draft_slot(make_engine, monkeypatch, trees):
    """Aborting everything (what a server does on SIGTERM) while a verify step is in flight:
    that step's drafts hold KV slots no request's text covers yet, which must still end in the
    cache or the free list."""
    import threading

    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    engine = make_engine(max_total_tokens=4096, **(TREE if trees else
                                                   {"speculative_algorithm": "NGRAM"}))
    chunks: list[dict] = []

    def stream() -> None:
        for chunk in engine.generate(COPY, {"max_new_tokens": 400, "temperature": 0,
                                            "ignore_eos": True}, stream=True):
            chunks.append(chunk)

    t = threading.Thread(target=stream)
    t.start()
    while len(chunks) < 3 and t.is_alive():
        t.join(timeout=0.01)
    engine.abort_all()
    t.join(timeout=60)
    assert chunks and chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert chunks[-1]["meta_info"]["spec_verify_ct"] > 0
    assert_pool_empty(engine)


# ---------------------------------------------------------------------- draft-model trees


def test_draft_model_tree_flags_are_checked():
    from radixlm.config import ServerArgs
    ok = dict(speculative_algorithm="STANDALONE", speculative_draft_model_path="/m",
              speculative_eagle_topk=4, speculative_num_steps=5)
    assert ServerArgs(**ok).uses_draft_trees
    assert not ServerArgs(**{**ok, "speculative_eagle_topk": 1}).uses_draft_trees
    for kwargs, flag in [({"speculative_eagle_topk": 9}, "--speculative-eagle-topk"),
                         ({"speculative_eagle_topk": 8, "speculative_num_steps": 9},
                          "--speculative-eagle-topk: 8 x --speculative-num-steps 9"),
                         ({"speculative_num_draft_tokens": 63}, "--speculative-num-draft"),
                         ({"enable_torch_compile": True}, "--enable-torch-compile"),
                         ({"speculative_algorithm": "NGRAM", "speculative_draft_model_path": None},
                          "--speculative-eagle-topk: needs --speculative-algorithm STANDALONE")]:
        with pytest.raises(ValueError, match=flag):
            ServerArgs(**{**ok, **kwargs})


def test_draft_model_trees_keep_the_target_output(make_engine, smollm_dir, monkeypatch):
    """--speculative-eagle-topk 3: the draft model (here the target itself) expands its 3 best
    candidates a step into a tree of 8 nodes; the target's path through it is kept. Greedy
    requests draft trees, a batch with a sampled one falls back to chains; the outputs equal
    the engine without drafts, and the identical draft's top-1 path is always kept."""
    monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
    greedy = {"max_new_tokens": 24, "temperature": 0}
    batches = [([COPY, CODE, "The capital of France is"], [greedy] * 3),
               ([COPY, CODE], [greedy, {"max_new_tokens": 16, "temperature": 0.8,
                                        "sampling_seed": 2}])]
    outs, stats = {}, None
    for spec in (False, True):
        extra = (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path=smollm_dir,
                      speculative_num_steps=3, speculative_eagle_topk=3,
                      speculative_num_draft_tokens=8) if spec else {})
        engine = make_engine(max_total_tokens=4096, **extra)
        outs[spec] = [o for prompts, params in batches for o in engine.generate(prompts, params)]
        stats = engine.get_stats()
        assert_pool_empty(engine)
        engine.shutdown()
    assert [o["output_ids"] for o in outs[True]] == [o["output_ids"] for o in outs[False]]
    first = outs[True][0]["meta_info"]
    assert first["completion_tokens"] / first["spec_verify_ct"] >= 3.0, first
    assert stats.spec_accept_length >= 3.0, stats


def test_draft_model_trees_stop_at_the_context_end(make_engine, smollm_dir):
    """A greedy request decoding up to --context-length: near the end a request may verify
    only a node or two, and the draft model's tree (4 x 4 candidates a step, 5 steps) must not
    grow past what can be verified (nor its scratch past the request's table row)."""
    outs = {}
    for spec in (False, True):
        extra = (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path=smollm_dir,
                      speculative_num_steps=5, speculative_eagle_topk=4,
                      speculative_num_draft_tokens=12) if spec else {})
        engine = make_engine(max_total_tokens=2048, context_length=72, **extra)
        # (no max_new_tokens: the default budget is cut to what the context leaves, where a
        # named one past it would be refused)
        outs[spec] = engine.generate(COPY, {"temperature": 0, "ignore_eos": True})
        assert_pool_empty(engine)
        engine.shutdown()
    assert outs[True]["output_ids"] == outs[False]["output_ids"]
    assert outs[True]["meta_info"]["finish_reason"] == outs[False]["meta_info"]["finish_reason"]
    assert outs[True]["meta_info"]["spec_verify_ct"] > 0


def test_small_draft_model_trees_keep_the_target_output(make_engine, tmp_path):
    """A random tiny draft model's trees are mostly wrong, in every branch: the output is
    still the target's."""
    from helpers import tiny_checkpoint
    draft = tiny_checkpoint(tmp_path / "draft", "llama")     # 512 positions
    outs = {}
    for spec in (False, True):
        extra = (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path=draft,
                      speculative_num_steps=3, speculative_eagle_topk=4,
                      speculative_num_draft_tokens=10) if spec else {})
        engine = make_engine(max_total_tokens=4096, context_length=512, **extra)
        outs[spec] = engine.generate([COPY, CODE], {"max_new_tokens": 16, "temperature": 0})
        stats = engine.get_stats()
        assert_pool_empty(engine)
        engine.shutdown()
    assert [o["output_ids"] for o in outs[True]] == [o["output_ids"] for o in outs[False]]
    assert stats.spec_verify_steps > 0, stats
