"""Naming the work a task was doing when its worker process died.

A worker killed by a segfault or the out-of-memory killer raises nothing
that says what it was doing: Ray reports only that "the worker died". A
caller that wants such a failure to name the input file, the stage or the
shard passes a *watch*: any picklable object with ``begin(key, what)`` and
``end(key)`` that Ray workers can call. Readers and writers call ``begin``
before a piece of work and ``end`` after it; ``key`` is the same when the
same work is rerun, ``what`` says it in words (``reading input file
'gs://b/raw/f2.jsonl'``). Work begun by a task that died and never ended is
what the caller names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["watching"]


@contextlib.contextmanager
def watching(watch: Any, key: str, what: str) -> Iterator[None]:
    """``watch.begin(key, what)`` before the block and ``watch.end(key)`` after it
    (not when it raises: an exception names its own cause); nothing without a watch."""
    if watch is None:
        yield
        return
    watch.begin(key, what)
    yield
    watch.end(key)
