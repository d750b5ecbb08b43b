"""The router's policies, approximate prefix trees, routing keys and flags, without processes."""

from __future__ import annotations

import random

import pytest

from helpers import cli_error
from radixlm.router.config import RouterArgs
from radixlm.router.policy import CacheAware, PowerOfTwo, RoundRobin, ShortestQueue, Worker
from radixlm.router.prefix_tree import PrefixTree
from radixlm.router.routing_key import routing_key


def workers(n: int) -> list[Worker]:
    return [Worker(f"http://w{i}", healthy=True) for i in range(n)]


# ---------------------------------------------------------------------- prefix tree

def test_tree_matches_longest_prefix_across_split_edges():
    t = PrefixTree()
    shared = "system: you are helpful. question: "
    t.insert(shared + "one")
    t.insert(shared + "two")
    t.insert("other")
    assert t.match(shared + "three") == len(shared + "t")
    assert t.match(shared + "one") == len(shared + "one")
    assert t.match("oth") == 3 and t.match("zzz") == 0 and t.match("") == 0
    # Stored once: the shared part, two tails, "other".
    assert t.size == len(shared) + len("one") + len("two") + 5


def test_tree_evicts_least_recently_used_leaves_first():
    t = PrefixTree()
    for key in ("aaaa1111", "bbbb2222", "cccc3333"):
        t.insert(key)
    t.match("aaaa1111")               # a is now the most recently used
    dropped = t.evict(max_size=9)
    assert dropped == 16 and t.size == 8
    assert t.match("aaaa1111") == 8 and t.match("bbbb2222") == 0 and t.match("cccc3333") == 0


def test_tree_eviction_climbs_to_parents_that_become_leaves():
    t = PrefixTree()
    t.insert("shared-x")
    t.insert("shared-y")
    assert t.size == len("shared-") + 2
    assert t.evict(0) == len("shared-") + 2        # both leaves, then "shared-" itself
    assert t.size == 0 and t.match("shared-x") == 0


# ---------------------------------------------------------------------- cache-aware

def cache_aware(threshold: float = 0.5, abs_t: int = 4, rel_t: float = 1.5) -> CacheAware:
    return CacheAware(threshold, abs_t, rel_t)


def test_requests_sharing_a_prefix_follow_the_first():
    policy, ws = cache_aware(), workers(3)
    system = "You are a travel agent. " * 10
    first = policy.choose(ws, system + "Where to go in May?").worker
    for q in ("Cheap flights?", "Best hotels?", "Visa rules?"):
        choice = policy.choose(ws, system + q)
        assert choice.worker is first and choice.decision == "cache_hit"


def test_misses_spread_by_load_even_with_few_requests_in_flight():
    """SGLang #32983 / #14305: misses must not all land on one worker."""
    policy, ws = cache_aware(), workers(2)
    a = policy.choose(ws, "first unrelated prompt").worker
    a.in_flight += 1                        # still running
    b = policy.choose(ws, "second, quite different").worker
    assert b is not a
    # Nothing in flight: the smaller tree (more free cache) takes the next miss.
    a.in_flight = 0
    big = max(ws, key=lambda w: w.tree.size)
    assert policy.choose(ws, "zzz a third topic").worker is not big


def test_concurrent_arrivals_of_one_group_land_on_one_worker():
    """Requests of a group that arrive together (none finished yet) all follow the first: the
    tree is updated when a request is routed, not when it ends."""
    policy, ws = cache_aware(abs_t=64), workers(4)
    groups = {g: f"[group {g}] " + "shared system prompt. " * 20 for g in range(8)}
    arrivals = [(g, i) for g in groups for i in range(6)]
    random.Random(0).shuffle(arrivals)
    placed: dict[int, set[str]] = {g: set() for g in groups}
    for g, i in arrivals:
        w = policy.choose(ws, groups[g] + f"question {i}").worker
        w.in_flight += 1                    # nobody finishes during the burst
        placed[g].add(w.url)
    assert all(len(urls) == 1 for urls in placed.values())
    groups_per_worker = [sum(w.url in u for u in placed.values()) for w in ws]
    assert sorted(groups_per_worker) == [2, 2, 2, 2]   # new groups go to the smallest tree


def test_imbalance_overrides_cache_affinity():
    policy, ws = cache_aware(abs_t=4, rel_t=1.5), workers(2)
    prompt = "a long shared prefix " * 5
    home = policy.choose(ws, prompt + "1").worker
    other = next(w for w in ws if w is not home)
    home.in_flight = 10                     # 10 - 0 > 4 and 10 > 0 * 1.5
    choice = policy.choose(ws, prompt + "2")
    assert choice.worker is other and choice.decision == "imbalanced"
    home.in_flight, other.in_flight = 10, 8  # 2 apart: balanced again
    assert policy.choose(ws, prompt + "1, continued").worker is home   # its longer match


def test_short_matches_below_the_threshold_are_misses():
    policy, ws = cache_aware(threshold=0.8), workers(2)
    home = policy.choose(ws, "abcdefghij").worker
    home.in_flight = 1
    choice = policy.choose(ws, "abcde" + "z" * 20)   # 5 / 25 < 0.8
    assert choice.decision == "cache_miss" and choice.worker is not home


def test_other_policies():
    ws = workers(3)
    rr = RoundRobin()
    assert [rr.choose(ws, None).worker.url for _ in range(4)] == [
        "http://w0", "http://w1", "http://w2", "http://w0"]
    ws[0].in_flight, ws[1].in_flight, ws[2].in_flight = 5, 1, 3
    assert ShortestQueue().choose(ws, None).worker is ws[1]
    p2 = PowerOfTwo(random.Random(0))
    for _ in range(20):   # the busiest can never win a pair
        assert p2.choose(ws, None).worker is not ws[0]


# ---------------------------------------------------------------------- routing keys, flags

def test_routing_keys():
    assert routing_key("/generate", {"text": "hello"}) == "hello"
    assert routing_key("/generate", {"text": ["a", "b"]}) == "a"
    assert routing_key("/generate", {"input_ids": [1, 2, 3]}) == "\x01\x02\x03"
    assert routing_key("/v1/completions", {"prompt": "p"}) == "p"
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    assert routing_key("/v1/chat/completions", chat) == "<system>S<user>U"
    assert routing_key("/generate", [1, 2]) is None
    assert routing_key("/generate", {"input_ids": ["x"]}) is None


@pytest.mark.parametrize("flags, message", [
    (["--cache-threshold", "1.5"], "--cache-threshold"),
    (["--balance-rel-threshold", "0.5"], "--balance-rel-threshold"),
    (["--worker-urls", "localhost:1"], "--worker-urls"),
    (["--max-retries", "-1"], "--max-retries"),
    (["--health-check-interval-secs", "0"], "--health-check-interval-secs"),
    (["--polcy", "random"], "did you mean --policy"),
])
def test_bad_router_flags_name_the_flag(flags, message, capsys):
    code, err = cli_error(["router", *flags], capsys)
    assert code == 2 and message in err


def test_router_args_take_sglang_names():
    args = RouterArgs(worker_urls=["http://a:1/"], policy="round_robin", max_retries=0)
    assert args.policy == "round_robin"
    with pytest.raises(ValueError, match="--policy"):
        RouterArgs(policy="least_busy")

