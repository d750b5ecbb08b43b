"""utils/gc_freeze.py: the engine's processes exempt their start-up heap from the cycle
collector's passes, and the collector still frees the cycles made after it (in a child
process: freezing pytest's own heap would keep its garbage for good)."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc, weakref
import torch
from radixlm.utils.gc_freeze import freeze_startup_heap
before = len(gc.get_objects())
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() and frozen >= before // 2 > 10_000, (frozen, before)
assert len(gc.get_objects()) < 1_000, len(gc.get_objects())   # what a full pass walks now

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a                      # a cycle made after the freeze
alive = weakref.ref(a)
del a, b
gc.collect()
assert alive() is None
print("ok", frozen)
"""


def test_freeze_leaves_new_cycles_collectable():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr
