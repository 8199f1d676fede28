"""The garbage collector and a long-lived server process.

A web or worker process holds a large heap that never changes once it has started: Django's
models and URL patterns, DRF's serializers, pydantic schemas from Ray, compiled regexes. Python's
cyclic collector walks every tracked object in a generation when it collects it, so each full
collection walked all of that again; a request or a sync allocates enough to trigger them often.
Measured: a third of an unchanged cluster's sync CPU, and two thirds of a trivial API request's.
`gc.freeze()` moves what exists now to a permanent generation the collector skips; anything
allocated later is collected as before. In a process that forks (Celery's prefork pool), freezing
before the fork also keeps those pages shared with the children instead of copied by the
collector's writes to object headers (the advice of the `gc.freeze` documentation).

A request then allocates tens of thousands of objects that live until its response is written
(a list page's rows, their instances, their JSON). At Python's default threshold (a young
collection every 700 net allocations) a list request ran one to four collections that walked its
own rows again and again: 7-12% of its CPU, measured with `gc.callbacks`. With YOUNG_THRESHOLD
most requests end, and free their objects by reference counting, before any collection runs;
cycles are still collected, a few megabytes later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def freeze() -> None:
    """Collect what is garbage now, exempt every surviving object from later collections, and
    collect the young generation every YOUNG_THRESHOLD allocations."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
