"""settle_heap: the server's startup heap leaves the collector's generations, and cycles
made afterwards are still collected (in a fresh interpreter: it changes process state)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc, weakref
from dsec.gateway.server import GC_YOUNG, settle_heap
settle_heap()
assert gc.get_freeze_count() > 0, gc.get_freeze_count()
assert gc.get_threshold()[0] == GC_YOUNG, gc.get_threshold()
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None, "a cycle made after settle_heap was not collected"
print("ok")
"""


def test_settle_heap_freezes_and_still_collects_new_cycles():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
