"""One Ray aggregation per numeric column for the fitted scalers (imports Ray).

:class:`ColumnSummary` gathers, in one pass, what :mod:`._scaling` fits from a
column: the count, mean and sum of squared deviations of its finite values,
their min and max, and how many NaN and infinite values it holds. Nulls and
NaN are missing values and are skipped; infinities are counted, not summed,
so the caller can refuse them by name.

Numerics: each block is summarised two-pass (NumPy mean, then squared
deviations from it) and blocks merge with Chan's parallel formula, so the
variance does not suffer the cancellation of a sum-of-squares formula. A
column whose finite values are all equal (min == max) reports mean = that
value and std = 0 exactly, whatever rounding the sums carry.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ray.data.aggregate import AggregateFnV2
from ray.data.block import BlockAccessor

from slicefeed.transforms._dtypes import as_float64

#: Accumulator slots: finite count, mean, sum of squared deviations, min, max,
#: NaN count, +inf count, -inf count.
_N, _MEAN, _M2, _LO, _HI, _NAN, _POS, _NEG = range(8)


def _empty() -> list[float]:
    return [0, 0.0, 0.0, math.inf, -math.inf, 0, 0, 0]


class ColumnSummary(AggregateFnV2):
    """Finite-value moments, extremes and NaN / infinity counts of column ``on``.

    Finalises to a dict with keys ``count``, ``mean``, ``std`` (ddof 0),
    ``min``, ``max`` (of the finite values; ``mean``/``std`` are 0.0 and
    ``min``/``max`` None when there are none), ``nan``, ``posinf``, ``neginf``.
    """

    def __init__(self, on: str, alias_name: str):
        super().__init__(alias_name, zero_factory=_empty, on=on, ignore_nulls=True)

    def aggregate_block(self, block: Any) -> list[float]:
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
            mean = float(x.mean())
            acc[_N], acc[_MEAN] = int(x.size), mean
            acc[_M2] = float(np.square(x - mean).sum())
            acc[_LO], acc[_HI] = float(x.min()), float(x.max())
        return acc

    def combine(self, a: list[float], b: list[float]) -> list[float]:
        na, nb = a[_N], b[_N]
        out = [na + nb, 0.0, 0.0, min(a[_LO], b[_LO]), max(a[_HI], b[_HI]),
               a[_NAN] + b[_NAN], a[_POS] + b[_POS], a[_NEG] + b[_NEG]]
        if na == 0 or nb == 0:
            out[_MEAN], out[_M2] = (a[_MEAN], a[_M2]) if nb == 0 else (b[_MEAN], b[_M2])
            return out
        n = na + nb
        delta = b[_MEAN] - a[_MEAN]
        out[_MEAN] = a[_MEAN] + delta * (nb / n)
        out[_M2] = a[_M2] + b[_M2] + delta * delta * (na * (nb / n))
        return out

    def finalize(self, acc: list[float]) -> dict[str, Any]:
        n = acc[_N]
        counts = {"nan": int(acc[_NAN]), "posinf": int(acc[_POS]), "neginf": int(acc[_NEG])}
        if n == 0:
            return {"count": 0, "mean": 0.0, "std": 0.0, "min": None, "max": None, **counts}
        lo, hi = float(acc[_LO]), float(acc[_HI])
        if lo == hi:
            mean, std = lo, 0.0
        else:
            # Rounding may leave the mean a hair outside [min, max]; the data cannot.
            mean = min(max(float(acc[_MEAN]), lo), hi)
            std = math.sqrt(max(float(acc[_M2]), 0.0) / n)
        return {"count": int(n), "mean": mean, "std": std, "min": lo, "max": hi, **counts}
