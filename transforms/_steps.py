"""How a chain of row-level transforms runs: one step per transform, except
where one fused step gives exactly the two transforms' result with less work.

This module is the one place such rules live; every runner of a chain (a
pipeline's ``map_batches`` stage, :func:`apply_transforms`) takes its steps
from :func:`chain_steps`. docs/architecture.md, "Transform fusion", states
the rules and why each is exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pyarrow as pa

from slicefeed.transforms._contract import Transform
from slicefeed.transforms._image import DecodeResize


@dataclasses.dataclass(frozen=True)
class Step:
    """``count`` consecutive transforms of a chain, from index ``first``, run as
    one call of ``fn`` (``pa.Table -> pa.Table``, bad rows marked as the last of
    them would leave them)."""

    first: int
    count: int
    fn: Callable[[pa.Table], pa.Table]


def chain_steps(transforms: Sequence[Transform]) -> list[Step]:
    """The steps that run ``transforms`` in order. Fused: ``DecodeImage()``
    immediately followed by an exact-size ``Resize`` of the column it writes
    (:class:`DecodeResize`: bit-identical values, the same bad records)."""
    ts = list(transforms)
    out: list[Step] = []
    i = 0
    while i < len(ts):
        if i + 1 < len(ts) and DecodeResize.applies(ts[i], ts[i + 1]):
            out.append(Step(i, 2, DecodeResize(ts[i], ts[i + 1])))
            i += 2
        else:
            out.append(Step(i, 1, ts[i]))
            i += 1
    return out
