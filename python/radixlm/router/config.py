"""RouterArgs: the router's settings, with SGLang's router flag names (`--worker-urls`,
`--policy`, `--cache-threshold`, ...). `--max-retries` is also accepted as
`--retry-max-retries`, the newer sglang-router name."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from radixlm.router.policy import POLICIES


@dataclass(frozen=True)
class RouterArgs:
    worker_urls: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    cache_threshold: float = 0.3          # match length / request length for a cache hit
    balance_abs_threshold: int = 64       # imbalanced: busiest - idlest > this ...
    balance_rel_threshold: float = 1.5    # ... and busiest > this x idlest
    eviction_interval_secs: float = 60.0  # how often the trees are trimmed to max_tree_size
    max_tree_size: int = 2 ** 26          # characters per worker tree
    api_key: str | None = None            # required from clients, sent to workers
    request_timeout_secs: float = 1800.0
    max_retries: int = 3                  # other workers tried after a failure
    health_check_interval_secs: float = 10.0
    health_check_timeout_secs: float = 5.0
    max_payload_size: int = 512 * 1024 * 1024
    log_level: str = "info"

    def __post_init__(self) -> None:
        def bad(flag: str, msg: str) -> ValueError:
            return ValueError(f"--{flag}: {msg}")

        for url in self.worker_urls:
            check_worker_url(url, "--worker-urls")
        if self.policy not in POLICIES:
            raise bad("policy", f"must be one of {POLICIES}, got {self.policy!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise bad("cache-threshold", f"must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise bad("balance-abs-threshold", f"must be >= 0, got {self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise bad("balance-rel-threshold", f"must be >= 1, got {self.balance_rel_threshold}")
        for name in ("eviction_interval_secs", "request_timeout_secs",
                     "health_check_interval_secs", "health_check_timeout_secs"):
            if getattr(self, name) <= 0:
                raise bad(name.replace("_", "-"), f"must be > 0, got {getattr(self, name)}")
        if self.max_tree_size < 1:
            raise bad("max-tree-size", f"must be >= 1, got {self.max_tree_size}")
        if self.max_retries < 0:
            raise bad("max-retries", f"must be >= 0, got {self.max_retries}")
        if self.max_payload_size < 1:
            raise bad("max-payload-size", f"must be >= 1, got {self.max_payload_size}")
        if not 0 < self.port < 65536:
            raise bad("port", f"must be in 1..65535, got {self.port}")

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        d = cls()
        p.add_argument("--worker-urls", nargs="*", default=[], metavar="URL",
                       help="the workers (radixlm or SGLang servers), e.g. http://127.0.0.1:30001")
        p.add_argument("--host", default=d.host)
        p.add_argument("--port", type=int, default=d.port)
        p.add_argument("--policy", choices=POLICIES, default=d.policy)
        p.add_argument("--cache-threshold", type=float, default=d.cache_threshold,
                       help="least match length / request length that counts as a cache hit")
        p.add_argument("--balance-abs-threshold", type=int, default=d.balance_abs_threshold)
        p.add_argument("--balance-rel-threshold", type=float, default=d.balance_rel_threshold)
        p.add_argument("--eviction-interval-secs", type=float, default=d.eviction_interval_secs)
        p.add_argument("--max-tree-size", type=int, default=d.max_tree_size,
                       help="characters kept per worker's approximate prefix tree")
        p.add_argument("--api-key", default=None,
                       help="clients must send it (Authorization: Bearer); sent on to workers")
        p.add_argument("--request-timeout-secs", type=float, default=d.request_timeout_secs)
        p.add_argument("--max-retries", "--retry-max-retries", dest="max_retries", type=int,
                       default=d.max_retries, help="other workers tried after a failure")
        p.add_argument("--health-check-interval-secs", type=float,
                       default=d.health_check_interval_secs)
        p.add_argument("--health-check-timeout-secs", type=float,
                       default=d.health_check_timeout_secs)
        p.add_argument("--max-payload-size", type=int, default=d.max_payload_size,
                       help="largest request body in bytes (larger: HTTP 413)")
        p.add_argument("--log-level", default=d.log_level,
                       choices=("debug", "info", "warning", "warn", "error"))

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "RouterArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})


def check_worker_url(url: str, where: str = "url") -> str:
    """An http(s) URL with a host; returned without a trailing slash. `where` names what gave
    it in the error (a flag, or the `url` query parameter)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: {url!r} is not a worker URL (http://HOST:PORT)")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"{where}: {url!r} has an invalid port") from None
    return url.rstrip("/")
