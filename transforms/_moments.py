"""The column statistics the fitted scalers need, in one Ray pass (imports Ray).

:class:`ColumnSummary` gathers, in one pass, what :mod:`._scaling` fits from a
column: the count, mean and standard deviation of its finite values, their min
and max, and how many NaN and infinite values it holds. Nulls and NaN are
missing values and are skipped; infinities are counted, not summed, so the
caller can refuse them by name.

Determinism: Ray promises neither the order it merges per-block partial
results in nor how it cuts the rows into blocks, and rounded floating-point
merges (sums, Chan's parallel variance) are not associative, so such a fit can
differ in its last bits from run to run.
Here every partial result is exact: the sum of the values and the sum of their
squares are kept as integers (in units of 2^-1126, of which every finite
float64 is a multiple, and its square), so merging is integer addition, which
gives the same result in any order and for any cut of the rows into blocks.
Min and max are exact too, with a zero extreme always +0.0 (``min(0.0, -0.0)``
would otherwise keep whichever came first). The mean and std are rounded once,
in :meth:`finalize`, from those exact sums: the summary is a function of the
multiset of values alone. This costs a few vectorised integer passes per
block; keying partials by block and merging them sorted would cost less but
still depend on how the rows are cut into blocks, which Ray does not promise
to keep.

Numerics: the mean is the exact mean correctly rounded; the variance is exact
until its square root (an integer square root with 64+ significant bits, then
one rounding), so there is no cancellation, and a column whose finite values
are all equal reports mean = that value and std = 0 exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.data.aggregate import AggregateFnV2
from ray.data.block import BlockAccessor

from slicefeed.transforms._dtypes import as_float64

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

#: Accumulator slots: finite count, exact sum (an int, units 2^-_BIAS), exact
#: sum of squares (an int, units 2^-2*_BIAS), min, max, NaN count, +inf count,
#: -inf count.
_N, _SUM, _SQ, _LO, _HI, _NAN, _POS, _NEG = range(8)
#: Every finite float64 is an integer multiple of 2^-1074; as ``m * 2^f`` with
#: a 53-bit integer ``m`` (``np.frexp``), ``f >= -1126``.
_BIAS = 1126
#: Rows per chunk: a bin sums at most this many integers below 2^37, far
#: below int64's 2^63.
_CHUNK = 1 << 24
_MASK18 = (1 << 18) - 1
_MASK26 = (1 << 26) - 1


def _empty() -> list[Any]:
    return [0, 0, 0, math.inf, -math.inf, 0, 0, 0]


def _bin_sum(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per-``index`` int64 sums of ``values`` (exact: no bin overflows)."""
    bins = np.zeros(size, np.int64)
    np.add.at(bins, index, values)
    return bins


def _shifted(bins: np.ndarray, scale: int, offset: int) -> int:
    """``sum(bins[k] << (scale * k + offset))`` as a Python int."""
    return sum(int(bins[k]) << (scale * int(k) + offset) for k in np.flatnonzero(bins))


def _exact_sums(x: np.ndarray) -> tuple[int, int]:
    """The exact sum of ``x`` (finite float64) in units of 2^-_BIAS and the
    exact sum of its squares in units of 2^-2*_BIAS.

    Each value is ``m * 2^(g - _BIAS)`` with an integer ``|m| < 2^53`` and
    ``g >= 0``; ``m`` is cut into pieces whose products stay below 2^37, and
    each piece (or product) is summed per ``g`` in int64 bins, a few thousand
    at most, which are then shifted into place as Python ints.
    """
    total = squares = 0
    for i in range(0, x.size, _CHUNK):
        mant, e = np.frexp(x[i:i + _CHUNK])
        m = np.ldexp(mant, 53).astype(np.int64)
        g = e.astype(np.intp)
        g += _BIAS - 53
        size = int(g.max()) + 1
        # m = hi * 2^26 + lo with lo in [0, 2^26) (>> floors, so hi carries the sign).
        total += _shifted(_bin_sum(g, m >> 26, size), 1, 26)
        total += _shifted(_bin_sum(g, m & _MASK26, size), 1, 0)
        # |m| = a * 2^36 + b * 2^18 + c with 18-bit pieces (a has 17), so
        # m^2 = a^2 2^72 + ab 2^55 + (2ac + b^2) 2^36 + bc 2^19 + c^2. In place:
        # a few passes over the chunk are most of a fit's cost.
        np.abs(m, out=m)
        a = m >> 36
        b = m >> 18
        b &= _MASK18
        c = m
        c &= _MASK18
        t = a * a
        squares += _shifted(_bin_sum(g, t, size), 2, 72)
        np.multiply(a, b, out=t)
        squares += _shifted(_bin_sum(g, t, size), 2, 55)
        np.multiply(a, c, out=a)
        a <<= 1
        np.multiply(b, b, out=t)
        a += t
        squares += _shifted(_bin_sum(g, a, size), 2, 36)
        np.multiply(b, c, out=t)
        squares += _shifted(_bin_sum(g, t, size), 2, 19)
        np.multiply(c, c, out=c)
        squares += _shifted(_bin_sum(g, c, size), 2, 0)
    return total, squares


class ColumnSummary(AggregateFnV2):
    """Finite-value moments, extremes and NaN / infinity counts of column ``on``.

    Finalises to a dict with keys ``count``, ``mean``, ``std`` (ddof 0),
    ``min``, ``max`` (of the finite values; ``mean``/``std`` are 0.0 and
    ``min``/``max`` None when there are none), ``nan``, ``posinf``, ``neginf``.
    With ``moments=False`` the sums are skipped (most of the cost) and
    ``mean``/``std`` are None. The result depends only on the multiset of
    values, never on the blocks they came in or the order those were merged.
    """

    def __init__(self, on: str, alias_name: str, *, moments: bool = True):
        self._moments = moments
        super().__init__(alias_name, zero_factory=_empty, on=on, ignore_nulls=True)

    def aggregate_block(self, block: Any) -> list[Any]:
        col = BlockAccessor.for_block(block).to_arrow().column(self._target_col_name)
        x = np.asarray(as_float64(col.drop_null()).to_numpy(zero_copy_only=False), np.float64)
        acc = _empty()
        finite = np.isfinite(x)
        if not finite.all():
            acc[_NAN] = int(np.isnan(x).sum())
            acc[_POS] = int(np.isposinf(x).sum())
            acc[_NEG] = int(np.isneginf(x).sum())
            x = x[finite]
        if x.size:
            acc[_N] = int(x.size)
            if self._moments:
                acc[_SUM], acc[_SQ] = _exact_sums(x)
            # + 0.0 turns a -0.0 extreme into +0.0, so equal extremes have one bit pattern.
            acc[_LO], acc[_HI] = float(x.min()) + 0.0, float(x.max()) + 0.0
        return acc

    def combine(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [a[_N] + b[_N], a[_SUM] + b[_SUM], a[_SQ] + b[_SQ],
                min(a[_LO], b[_LO]), max(a[_HI], b[_HI]),
                a[_NAN] + b[_NAN], a[_POS] + b[_POS], a[_NEG] + b[_NEG]]

    def finalize(self, acc: list[Any]) -> dict[str, Any]:
        n = int(acc[_N])
        counts = {"nan": int(acc[_NAN]), "posinf": int(acc[_POS]), "neginf": int(acc[_NEG])}
        if n == 0:
            return {"count": 0, "mean": 0.0, "std": 0.0, "min": None, "max": None, **counts}
        lo, hi = float(acc[_LO]), float(acc[_HI])
        if not self._moments:
            return {"count": n, "mean": None, "std": None, "min": lo, "max": hi, **counts}
        total, squares = int(acc[_SUM]), int(acc[_SQ])
        # int / int is correctly rounded in Python, however large the operands;
        # + 0.0 makes a zero mean +0.0. The exact mean lies in [min, max], and so
        # does its rounding.
        mean = total / (n << _BIAS) + 0.0
        # n^2 * variance, in units of 2^-2*_BIAS: exact, and 0 for a constant column.
        dev = n * squares - total * total
        # sqrt(dev) to at least 64 significant bits, then one rounding.
        s = max(0, (130 - dev.bit_length()) // 2)
        std = math.isqrt(dev << (2 * s)) / (n << (_BIAS + s))
        return {"count": n, "mean": mean, "std": std, "min": lo, "max": hi, **counts}


def summarize(ds: ray.data.Dataset, columns: Sequence[str], *, moments: bool = True
              ) -> dict[str, dict[str, Any]]:
    """:class:`ColumnSummary` results of ``columns`` over all of ``ds``, by column.

    One Ray pass: each block's accumulators (exact integers, see the module
    docstring) are computed on a worker and sent to the driver as one small
    JSON row, where they are merged as they arrive; merging is integer
    addition and min/max, so the arrival order does not matter.
    """
    import pyarrow as pa

    cols = list(columns)
    summaries = [ColumnSummary(c, alias_name=c, moments=moments) for c in cols]

    def partial(batch: pa.Table) -> pa.Table:
        return pa.table({"acc": [json.dumps([s.aggregate_block(batch) for s in summaries])]})

    accs = [_empty() for _ in cols]
    parts = ds.select_columns(cols).map_batches(partial, batch_format="pyarrow", batch_size=None)
    for b in parts.iter_batches(batch_format="pyarrow", batch_size=None):
        for text in b.column("acc").to_pylist():
            accs = [s.combine(a, p) for s, a, p in zip(summaries, accs, json.loads(text))]
    return {c: s.finalize(a) for c, s, a in zip(cols, summaries, accs)}
