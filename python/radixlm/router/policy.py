"""Which worker takes a request: the router's load-balancing policies (SGLang's names).

Load is what the router itself sees: each worker's requests in flight through the router.
Every policy picks among the workers it is given (the healthy ones, minus any that already
failed this request), so a retry can never land on the worker that just failed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from radixlm.router.prefix_tree import PrefixTree

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "shortest_queue")


@dataclass(eq=False)
class Worker:
    url: str
    healthy: bool = False
    model_id: str = ""                 # the model_path its /get_model_info reported
    api_key: str | None = field(default=None, repr=False)   # its own key (else the router's)
    in_flight: int = 0                 # requests sent and not yet answered
    requests_total: int = 0
    failures_total: int = 0            # times taken out (failed requests, health checks)
    tree: PrefixTree = field(default_factory=PrefixTree)


@dataclass
class Choice:
    worker: Worker
    decision: str        # for metrics: cache_hit | cache_miss | imbalanced | the policy's name


class Policy:
    name = ""

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        raise NotImplementedError


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self.counter = 0

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        self.counter += 1
        return Choice(workers[(self.counter - 1) % len(workers)], self.name)


class Random(Policy):
    name = "random"

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        return Choice(self.rng.choice(workers), self.name)


class PowerOfTwo(Policy):
    """Two workers at random, the less loaded of them."""
    name = "power_of_two"

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        pair = self.rng.sample(workers, 2) if len(workers) > 1 else workers
        return Choice(min(pair, key=lambda w: w.in_flight), self.name)


class ShortestQueue(Policy):
    name = "shortest_queue"

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        return Choice(least_loaded(workers), self.name)


def least_loaded(workers: list[Worker]) -> Worker:
    """Fewest requests in flight; ties go to the smaller tree (more cache free), then to the
    first listed. Used for misses too, so that with fewer requests in flight than workers the
    misses still spread instead of all going to the one worker with the smallest tree."""
    return min(workers, key=lambda w: (w.in_flight, w.tree.size))


def most_free_cache(workers: list[Worker]) -> Worker:
    """Where a cache miss goes: the smallest tree (the most cache free for a new prefix), among
    the workers no busier than average. The tree size spreads new prefix groups evenly even in
    a burst, where in-flight counts mostly reflect which groups arrived first; the load filter
    keeps a worker whose tree stays small (short requests, or just evicted) from drawing every
    miss while it is busy (SGLang #32983, #14305)."""
    mean = sum(w.in_flight for w in workers) / len(workers)
    return min((w for w in workers if w.in_flight <= mean),
               key=lambda w: (w.tree.size, w.in_flight))


class CacheAware(Policy):
    """SGLang's cache-aware routing over approximate per-worker prefix trees.

    Balanced load (the busiest and the idlest worker differ by no more than
    `balance_abs_threshold` requests, or the busiest has no more than `balance_rel_threshold`
    times the idlest's): the worker with the longest prefix match, if that match covers at
    least `cache_threshold` of the request; otherwise (a miss) the smallest tree among the
    workers no busier than average (`most_free_cache`). Unbalanced: the least loaded worker.
    The request's key goes into the chosen worker's tree at once, so requests of one prefix
    group that arrive together all follow the first of them.
    """
    name = "cache_aware"

    def __init__(self, cache_threshold: float, balance_abs_threshold: int,
                 balance_rel_threshold: float) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def is_imbalanced(self, workers: list[Worker]) -> bool:
        loads = [w.in_flight for w in workers]
        busiest, idlest = max(loads), min(loads)
        return (busiest - idlest > self.balance_abs_threshold
                and busiest > idlest * self.balance_rel_threshold)

    def choose(self, workers: list[Worker], key: str | None) -> Choice:
        if self.is_imbalanced(workers):
            choice = Choice(least_loaded(workers), "imbalanced")
        elif not key:
            choice = Choice(most_free_cache(workers), "cache_miss")
        else:
            matches = [(w.tree.match(key), w) for w in workers]
            best_len = max(m for m, _ in matches)
            if best_len / len(key) >= self.cache_threshold:
                # Among equally long matches, the least loaded one.
                best = least_loaded([w for m, w in matches if m == best_len])
                choice = Choice(best, "cache_hit")
            else:
                choice = Choice(most_free_cache(workers), "cache_miss")
        if key:
            choice.worker.tree.insert(key)
        return choice


def create_policy(name: str, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                  balance_rel_threshold: float = 1.5) -> Policy:
    if name == "cache_aware":
        return CacheAware(cache_threshold, balance_abs_threshold, balance_rel_threshold)
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return Random()
    if name == "power_of_two":
        return PowerOfTwo()
    if name == "shortest_queue":
        return ShortestQueue()
    raise ValueError(f"--policy: must be one of {POLICIES}, got {name!r}")
