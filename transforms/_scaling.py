"""Scaling with statistics fitted over the whole dataset: Standardize, MinMaxScale.

Both are a :class:`_FittedScaler`: numeric columns in, float columns out,
``y = (x - offset) / scale`` per column, with the two per-column statistics
either given in the spec or computed by one Ray pass in :meth:`fit`
(:class:`._moments.ColumnSummary` per column). A subclass names its two
statistics and picks them from that summary.

Fitting follows the convention of common scalers: nulls and NaN are missing
values, skipped by the fit and left null / NaN by the transform; an infinity
is refused by name (no finite statistic exists), never replaced.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import printable, short_repr
from slicefeed.transforms._contract import Transform
from slicefeed.transforms._dtypes import as_float64

if TYPE_CHECKING:  # pragma: no cover
    import ray.data


def _float_type(owner: Transform, dtype: str) -> pa.DataType:
    if dtype not in ("float32", "float64"):
        raise owner._spec_error(f"dtype must be float32 or float64; got {short_repr(dtype)}")
    return pa.float32() if dtype == "float32" else pa.float64()


@dataclasses.dataclass(frozen=True)
class _FittedScaler(Transform):
    """Per-column affine scaling with two fitted statistics per column.

    Subclasses declare ``columns``, ``dtype`` and two optional ``{column: value}``
    fields named by :attr:`STATS`, and implement :meth:`_aggregations` and
    :meth:`_offset_scale`.
    """

    needs_fit: ClassVar[bool] = True
    #: The two statistic fields, e.g. ``("mean", "std")``.
    STATS: ClassVar[tuple[str, str]] = ("", "")
    #: Whether :meth:`_fitted` reads the summary's mean and std (their exact
    #: sums are most of a fit's cost; min and max alone are cheap).
    MOMENTS: ClassVar[bool] = True
    columns: tuple[str, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", self._column_list(self.columns, "columns"))
        _float_type(self, self.dtype)
        for k in self.STATS:
            v = getattr(self, k)
            if v is not None:
                v = self._column_mapping(v, k)
                missing = [c for c in self.columns if c not in v]
                if missing:
                    raise self._spec_error(f"{k} has no value for column {short_repr(missing[0])}")
                object.__setattr__(self, k, {c: self._number(v[c], k, c) for c in self.columns})

    def _number(self, value: Any, arg: str, column: str) -> float:
        """A statistic given in the spec as a float (an integer beyond float64's
        range is refused, naming the column, instead of overflowing)."""
        try:
            return float(value)
        except OverflowError:
            raise self._spec_error(f"{arg} for column {short_repr(column)} must be a finite number; "
                                   f"got {short_repr(value)}") from None

    @property
    def is_fitted(self) -> bool:
        return all(getattr(self, k) is not None for k in self.STATS)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for c in self.columns:
            self._require(schema, c, kinds=("numeric",), arg="columns")
        t = _float_type(self, self.dtype)
        for c in self.columns:
            schema = schema.set(schema.get_field_index(c), pa.field(c, t))
        return schema

    def _fitted(self, summary: dict[str, Any]) -> tuple[float, float]:
        """The two statistics of one column from its :class:`ColumnSummary` result
        (finite values only; there is at least one)."""
        raise NotImplementedError

    def _offset_scale(self, column: str) -> tuple[float, float]:
        """``(offset, scale)`` of ``column`` from the fitted statistics."""
        raise NotImplementedError

    def fit(self, ds: ray.data.Dataset) -> _FittedScaler:
        """Returns a copy holding both statistics of every column, from one Ray
        pass over ``ds``: each block's partial :class:`ColumnSummary` of every
        column, merged on the driver as they stream in (a few small values
        per block; a Ray ``aggregate`` would start a hash shuffle's actors,
        about 3 s fixed per fit, for the same merge).

        Nulls and NaN are missing values: skipped. A column with no finite
        value fits 0 for both statistics (its outputs are all null or NaN).
        The statistics are a function of the column's values alone: the same
        bits whichever order Ray's tasks finish in and however the rows are
        cut into blocks (exact sums, rounded once; see :mod:`._moments`).

        Raises:
            SpecError: a column holds +inf or -inf, which has no finite
                statistic; naming the column and the count.
        """
        from slicefeed.transforms._moments import summarize

        r = summarize(ds, self.columns, moments=self.MOMENTS)
        fitted: dict[str, dict[str, float]] = {k: {} for k in self.STATS}
        for c in self.columns:
            s = r[c]
            inf = int(s["posinf"] or 0) + int(s["neginf"] or 0)
            if inf:
                a, b = self.STATS
                raise self._spec_error(
                    f"column {printable(c, 200)!r} holds {inf} infinite value{'s' * (inf != 1)} "
                    f"(+inf: {s['posinf']}, -inf: {s['neginf']}); its {a} and {b} are undefined. "
                    f"Drop those rows first with a filter step that keeps the finite values "
                    f"(expr: \"col({printable(c, 200)!r}) > -1e309 and col({printable(c, 200)!r}) "
                    f"< 1e309\"; 1e309 reads as infinity), or give {a} and {b} in the spec."
                )
            pair = self._fitted(s) if s["count"] else (0.0, 0.0)
            for k, v in zip(self.STATS, pair):
                fitted[k][c] = float(v)
        return dataclasses.replace(self, **fitted)

    def stats(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.STATS} if self.is_fitted else {}

    def __call__(self, table: pa.Table) -> pa.Table:
        if not self.is_fitted:
            a, b = self.STATS
            raise self._spec_error(f"needs fit(ds) (or {a} and {b} in the spec) before use")
        t = _float_type(self, self.dtype)
        for c in self.columns:
            i = table.column_names.index(c)
            offset, scale = self._offset_scale(c)
            x = as_float64(table.column(i))
            y = pc.divide(pc.subtract(x, offset), scale or 1.0)
            table = table.set_column(i, pa.field(c, t), pc.cast(y, t))
        return table


@dataclasses.dataclass(frozen=True)
class Standardize(_FittedScaler):
    """``(x - mean) / std`` per column, with statistics fitted over the whole dataset.

    :meth:`fit` runs one Ray pass (mean and std with ddof=0 of the
    finite values; nulls and NaN skipped, +-inf refused with a SpecError) and
    returns a copy holding ``mean`` and ``std``; give them in the spec to skip
    fitting. A constant column (min == max) fits std 0 exactly and maps to 0.
    Nulls stay null and NaN stays NaN (put :class:`FillNull` first to replace
    nulls). Integer columns are scaled as float64 (beyond 2^53 that rounds to
    53 significant bits).

    Args:
        columns: Numeric columns.
        dtype: ``float32`` (default) or ``float64``.
        mean: ``{column: mean}`` (fitted). std: ``{column: std}`` (fitted).
    """

    name: ClassVar[str] = "standardize"
    STATS: ClassVar[tuple[str, str]] = ("mean", "std")
    mean: dict[str, float] | None = None
    std: dict[str, float] | None = None

    def _fitted(self, summary: dict[str, Any]) -> tuple[float, float]:
        return summary["mean"], summary["std"]

    def _offset_scale(self, column: str) -> tuple[float, float]:
        return self.mean[column], self.std[column]  # type: ignore[index]


@dataclasses.dataclass(frozen=True)
class MinMaxScale(_FittedScaler):
    """``(x - min) / (max - min)`` per column into [0, 1], fitted over the dataset.

    :meth:`fit` runs one Ray pass (min and max of the finite values;
    nulls and NaN skipped, +-inf refused with a SpecError). A constant column
    maps to 0. Nulls stay null and NaN stays NaN.

    Args:
        columns: Numeric columns.
        dtype: ``float32`` (default) or ``float64``.
        min: ``{column: min}`` (fitted). max: ``{column: max}`` (fitted).
    """

    name: ClassVar[str] = "min_max_scale"
    STATS: ClassVar[tuple[str, str]] = ("min", "max")
    MOMENTS: ClassVar[bool] = False
    min: dict[str, float] | None = None
    max: dict[str, float] | None = None

    def _fitted(self, summary: dict[str, Any]) -> tuple[float, float]:
        return summary["min"], summary["max"]

    def _offset_scale(self, column: str) -> tuple[float, float]:
        lo, hi = self.min[column], self.max[column]  # type: ignore[index]
        return lo, hi - lo
