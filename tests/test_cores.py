"""tests/cores.py, which sizes the test run's xdist workers and their threads."""

from __future__ import annotations

import os
import subprocess
import sys

from cores import usable_cores


def test_usable_cores_is_within_what_the_process_may_run_on():
    n = usable_cores()
    assert 1 <= n <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert n <= len(os.sched_getaffinity(0))


def test_script_prints_the_worker_count():
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, os.path.join(here, "cores.py")], capture_output=True,
                         text=True, check=True).stdout
    assert int(out) == min(4, usable_cores())
