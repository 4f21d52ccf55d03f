"""Conformance helper for JaxLoader configurations (after Grain's
``assert_equal_output_after_checkpoint``): determinism and exact resume."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import numpy as np


def batch_digest(batch: dict) -> str:
    """A checksum of one global batch: keys, shapes, dtypes and bytes of every array."""
    h = hashlib.sha256()
    for k in sorted(batch):
        a = np.asarray(batch[k])
        h.update(f"{k}|{a.shape}|{a.dtype}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:20]


def digests(loader, limit: int | None = None, check=None) -> list[str]:
    out = []
    for b in loader:
        if check is not None:
            check(b)
        out.append(batch_digest(b))
        if limit is not None and len(out) >= limit:
            break
    return out


def assert_equal_output_after_checkpoint(
    make_loader: Callable[..., object],
    checkpoints: list[int],
    *,
    check_batch: Callable[[dict], None] | None = None,
) -> list[str]:
    """Checks a loader configuration for determinism and exact resume.

    ``make_loader(state=None | dict)`` must build a fresh loader of one configuration.

    1. Two uninterrupted runs yield bit-identical batches.
    2. For every ``k`` in ``checkpoints``: consume ``k`` batches, take ``state_dict()``
       (through a JSON round trip, which also checks it is small and serialisable),
       build a new loader from it: it yields exactly the batches ``k:`` of the
       uninterrupted run.

    ``check_batch(batch)`` is called on every batch of the first run (value checks).

    Returns the digests of the uninterrupted run.
    """
    ref = digests(make_loader(state=None), check=check_batch)
    again = digests(make_loader(state=None))
    assert again == ref, "two runs of the same configuration differ (not deterministic)"
    assert ref, "the configuration yields no batches"
    for k in checkpoints:
        assert 0 < k <= len(ref), f"checkpoint {k} outside 1..{len(ref)}"
        loader = make_loader(state=None)
        head = digests(loader, limit=k)
        state = loader.state_dict()
        loader.close()
        text = json.dumps(state)
        assert len(text) < 4096, f"state_dict is not small: {len(text)} bytes"
        resumed = make_loader(state=json.loads(text))
        tail = digests(resumed)
        assert head == ref[:k]
        assert tail == ref[k:], (
            f"resume after {k} batches (state {state}) diverges: "
            f"{len(tail)} batches vs {len(ref) - k} expected"
        )
    return ref
