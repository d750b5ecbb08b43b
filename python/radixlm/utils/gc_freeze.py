"""Keep Python's cycle collector off the serving loop's critical path.

A process of the engine holds ~300,000 container objects once started (modules, the
tokenizer's vocabulary, the model's parameters and their wrappers), and the collector's full
pass walks all of them: ~130 ms on a development CPU. Requests coming and going keep promoting
objects to the oldest generation, so such a pass comes every few thousand requests, and the
scheduler's loop (every running request's next token) or the HTTP server's event loop stands
still meanwhile: a tail-latency spike that no profile of the step shows.

Once start-up is over, what is alive stays alive for the life of the process: it is moved to
the collector's permanent generation (`gc.freeze`), which full passes skip. Only the process's
own start-up objects are frozen: the engine's child processes and `radixlm serve`, never a
user's process that embeds the Engine.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then exempt every object alive now from later collections. Returns how
    many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
