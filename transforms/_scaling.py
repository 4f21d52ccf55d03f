"""Scaling with statistics fitted over the whole dataset: Standardize, MinMaxScale.

Both are a :class:`_FittedScaler`: numeric columns in, float columns out,
``y = (x - offset) / scale`` per column, with the two per-column statistics
either given in the spec or computed by one Ray aggregation in :meth:`fit`.
A subclass names its two statistics and says how to aggregate them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.transforms._contract import Transform

if TYPE_CHECKING:  # pragma: no cover
    import ray.data


def _float_type(owner: Transform, dtype: str) -> pa.DataType:
    if dtype not in ("float32", "float64"):
        raise owner._spec_error(f"dtype must be float32 or float64; got {dtype!r}")
    return pa.float32() if dtype == "float32" else pa.float64()


def _finite(v: Any, default: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return f if np.isfinite(f) else default


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
                    raise self._spec_error(f"{k} has no value for column {missing[0]!r}")
                object.__setattr__(self, k, {c: float(v[c]) for c in self.columns})

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

    def _aggregations(self, column: str) -> Sequence[Any]:
        """Ray aggregations for ``column``, aliased ``f"{stat}/{column}"`` per stat."""
        raise NotImplementedError

    def _offset_scale(self, column: str) -> tuple[float, float]:
        """``(offset, scale)`` of ``column`` from the fitted statistics."""
        raise NotImplementedError

    def fit(self, ds: ray.data.Dataset) -> _FittedScaler:
        aggs: list[Any] = []
        for c in self.columns:
            aggs += self._aggregations(c)
        r = ds.aggregate(*aggs)
        fitted = {k: {c: _finite(r[f"{k}/{c}"], 0.0) for c in self.columns} for k in self.STATS}
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
            x = pc.cast(table.column(i), pa.float64())
            y = pc.divide(pc.subtract(x, offset), scale or 1.0)
            table = table.set_column(i, pa.field(c, t), pc.cast(y, t))
        return table


@dataclasses.dataclass(frozen=True)
class Standardize(_FittedScaler):
    """``(x - mean) / std`` per column, with statistics fitted over the whole dataset.

    :meth:`fit` runs one Ray aggregation (``Mean``, ``Std`` with ddof=0; nulls
    ignored) and returns a copy holding ``mean`` and ``std``; give them in the
    spec to skip fitting. A constant column (std 0) maps to 0. Nulls stay null
    (put :class:`FillNull` first to replace them).

    Args:
        columns: Numeric columns.
        dtype: ``float32`` (default) or ``float64``.
        mean: ``{column: mean}`` (fitted). std: ``{column: std}`` (fitted).
    """

    name: ClassVar[str] = "standardize"
    STATS: ClassVar[tuple[str, str]] = ("mean", "std")
    mean: dict[str, float] | None = None
    std: dict[str, float] | None = None

    def _aggregations(self, column: str) -> Sequence[Any]:
        from ray.data.aggregate import Mean, Std

        return [Mean(column, alias_name=f"mean/{column}"), Std(column, ddof=0, alias_name=f"std/{column}")]

    def _offset_scale(self, column: str) -> tuple[float, float]:
        return self.mean[column], self.std[column]  # type: ignore[index]


@dataclasses.dataclass(frozen=True)
class MinMaxScale(_FittedScaler):
    """``(x - min) / (max - min)`` per column into [0, 1], fitted over the dataset.

    :meth:`fit` runs one Ray aggregation (``Min``, ``Max``). A constant column
    maps to 0. Nulls stay null.

    Args:
        columns: Numeric columns.
        dtype: ``float32`` (default) or ``float64``.
        min: ``{column: min}`` (fitted). max: ``{column: max}`` (fitted).
    """

    name: ClassVar[str] = "min_max_scale"
    STATS: ClassVar[tuple[str, str]] = ("min", "max")
    min: dict[str, float] | None = None
    max: dict[str, float] | None = None

    def _aggregations(self, column: str) -> Sequence[Any]:
        from ray.data.aggregate import Max, Min

        return [Min(column, alias_name=f"min/{column}"), Max(column, alias_name=f"max/{column}")]

    def _offset_scale(self, column: str) -> tuple[float, float]:
        lo, hi = self.min[column], self.max[column]  # type: ignore[index]
        return lo, hi - lo
