"""How many CPU cores this process may really use: the smaller of its affinity mask and its
cgroup's CPU quota (a container limited to 2 CPUs still sees all of the host's cores in
os.cpu_count()). scripts/test.sh sizes pytest-xdist by it, conftest.py each worker's threads."""

from __future__ import annotations

import math
import os


def usable_cores() -> int:
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(cores, quota) if quota else cores)


def _cgroup_quota() -> int | None:
    for path, parse in (("/sys/fs/cgroup/cpu.max", lambda t: t.split()),           # cgroup v2
                        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):              # cgroup v1
        try:
            with open(path) as f:
                text = f.read().strip()
            if parse is not None:
                limit, period = parse(text)
            else:
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    limit, period = text, f.read().strip()
            if limit in ("max", "-1"):
                return None
            return math.ceil(int(limit) / int(period))
        except (OSError, ValueError):
            continue
    return None


if __name__ == "__main__":      # scripts/test.sh: how many xdist workers (a core each, <= 4)
    print(min(4, usable_cores()))
