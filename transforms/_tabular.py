"""Tabular transforms: Select, Rename, Cast, Filter."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors._errors import short_repr
from slicefeed.transforms._base import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    RESERVED_COLUMNS,
    Transform,
    mark_errors,
)
from slicefeed.transforms._dtypes import (
    BFLOAT16,
    bfloat16_field,
    parse_type,
    to_bfloat16_bits,
)
from slicefeed.transforms._expr import compile_expression, evaluate_with_errors

if TYPE_CHECKING:  # pragma: no cover
    import ray.data


def _tuple_of_str(self: Transform, value: Any, arg: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise self._spec_error(f"{arg} must be a non-empty list of column names; got {value!r}")
    if not all(isinstance(v, str) for v in value):
        raise self._spec_error(f"{arg} must contain column names (strings); got {value!r}")
    dup = sorted({v for v in value if list(value).count(v) > 1})
    if dup:
        raise self._spec_error(f"{arg} names column {dup[0]!r} twice")
    return tuple(value)


def _check_mapping(self: Transform, value: Any, arg: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not value:
        raise self._spec_error(
            f"{arg} must be a non-empty mapping of column names, e.g. {{old: new}}; got {value!r}"
        )
    if not all(isinstance(k, str) for k in value):
        raise self._spec_error(f"{arg} keys must be column names (strings); got {value!r}")
    return dict(value)


@dataclasses.dataclass(frozen=True)
class Select(Transform):
    """Keeps ``columns`` (in that order), dropping the others.

    slicefeed's own columns (``_sf_file``, ``_sf_row``, ``_sf_error``) are kept
    when present, after the selected ones: the pipeline needs them to name bad
    rows and drops them before writing.

    Args:
        columns: Column names to keep.
    """

    name: ClassVar[str] = "select"
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _tuple_of_str(self, self.columns, "columns"))

    def _keep(self, names: Sequence[str]) -> list[str]:
        return [*self.columns, *(c for c in RESERVED_COLUMNS if c in names and c not in self.columns)]

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for c in self.columns:
            self._require(schema, c, arg="columns")
        return pa.schema([schema.field(c) for c in self._keep(schema.names)], schema.metadata)

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.select(self._keep(table.column_names))


@dataclasses.dataclass(frozen=True)
class Rename(Transform):
    """Renames columns.

    Args:
        mapping: ``{old_name: new_name}``.
    """

    name: ClassVar[str] = "rename"
    mapping: dict[str, str]

    def __post_init__(self) -> None:
        m = _check_mapping(self, self.mapping, "mapping")
        if not all(isinstance(v, str) and v for v in m.values()):
            raise self._spec_error(f"mapping values must be new column names; got {m!r}")
        for k, v in m.items():
            if k in RESERVED_COLUMNS or v in RESERVED_COLUMNS:
                raise self._spec_error(
                    f"cannot rename to or from slicefeed's own column {k if k in RESERVED_COLUMNS else v!r}"
                )
        targets = list(m.values())
        dup = sorted({t for t in targets if targets.count(t) > 1})
        if dup:
            raise self._spec_error(f"mapping renames two columns to {dup[0]!r}")
        object.__setattr__(self, "mapping", m)

    def _names(self, names: Sequence[str]) -> list[str]:
        return [self.mapping.get(n, n) for n in names]

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for old in self.mapping:
            self._require(schema, old, arg="mapping")
        kept = [n for n in schema.names if n not in self.mapping]
        for old, new in self.mapping.items():
            if new in kept:
                raise self._spec_error(
                    f"renaming {old!r} to {new!r} collides with the existing column {new!r}; "
                    f"drop or rename {new!r} first"
                )
        return pa.schema(
            [f.with_name(self.mapping.get(f.name, f.name)) for f in schema], schema.metadata
        )

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.rename_columns(self._names(table.column_names))


def _failing_rows(arr: pa.Array, fn) -> np.ndarray:
    """Rows of ``arr`` on which ``fn`` raises, by bisection (error path only).

    ``fn`` is applied to halves recursively, so k bad rows out of n cost
    O(k log n) calls instead of n.
    """
    bad = np.zeros(len(arr), dtype=bool)
    stack = [(0, len(arr))]
    while stack:
        lo, hi = stack.pop()
        if hi <= lo:
            continue
        try:
            fn(arr.slice(lo, hi - lo))
            continue
        except (pa.ArrowInvalid, ValueError, OverflowError):
            pass
        if hi - lo == 1:
            bad[lo] = True
        else:
            mid = (lo + hi) // 2
            stack += [(lo, mid), (mid, hi)]
    return bad


def _list_like(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _with_value_type(t: pa.DataType, value_type: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(t):
        return pa.list_(value_type, t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(value_type)
    return pa.list_(value_type)


@dataclasses.dataclass(frozen=True)
class Cast(Transform):
    """Casts columns to other types (safe casts: overflow or unparsable values are errors).

    A value that cannot be cast (``"abc"`` to ``int32``, ``300`` to ``uint8``)
    marks its row bad instead of failing the batch. A list column cast to a
    scalar type casts its values (``list<int64>`` -> ``list<int32>``).
    ``"bfloat16"`` stores bfloat16 bit patterns as ``uint16`` with field
    metadata (see :mod:`slicefeed.transforms._dtypes`).

    Args:
        columns: ``{column: type}`` with types such as ``int32``, ``float32``,
            ``bfloat16``, ``string``, ``bool``, ``timestamp[us]``.
    """

    name: ClassVar[str] = "cast"
    columns: dict[str, str]

    def __post_init__(self) -> None:
        m = _check_mapping(self, self.columns, "columns")
        for col, t in m.items():
            parse_type(t, label=self._label(), arg=f"column {col!r}")
        object.__setattr__(self, "columns", m)

    def _target(self, col: str, src: pa.DataType) -> tuple[pa.DataType, bool]:
        """(Arrow type to cast to, is bfloat16) for ``col`` of type ``src``."""
        t = parse_type(self.columns[col], label=self._label(), arg=f"column {col!r}")
        bf16 = t == BFLOAT16
        scalar = pa.float32() if bf16 else t
        if _list_like(src) and not _list_like(scalar):
            return _with_value_type(src, scalar), bf16
        return scalar, bf16

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        fields = list(schema)
        for col in self.columns:
            src = self._require(schema, col, arg="columns")
            target, bf16 = self._target(col, src)
            try:
                pc.cast(pa.array([], src), target)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                raise self._spec_error(
                    f"cannot cast column {col!r} from {src} to {self.columns[col]}"
                ) from None
            if bf16 and not (
                pa.types.is_floating(target)
                or pa.types.is_integer(target)
                or (_list_like(target))
            ):
                raise self._spec_error(f"bfloat16 needs a numeric column; {col!r} is {src}")
            i = schema.get_field_index(col)
            fields[i] = self._out_field(col, target, bf16)
        return pa.schema(fields, schema.metadata)

    @staticmethod
    def _out_field(col: str, target: pa.DataType, bf16: bool) -> pa.Field:
        if not bf16:
            return pa.field(col, target)
        if _list_like(target):
            return bfloat16_field(col, _with_value_type(target, pa.uint16()))
        return bfloat16_field(col)

    def __call__(self, table: pa.Table) -> pa.Table:
        bad_all = np.zeros(table.num_rows, dtype=bool)
        reasons = np.full(table.num_rows, None, dtype=object)
        for col, type_name in self.columns.items():
            i = table.schema.get_field_index(col)
            arr = table.column(i).combine_chunks()
            target, bf16 = self._target(col, arr.type)
            try:
                out = pc.cast(arr, target)
            except (pa.ArrowInvalid, OverflowError):
                bad = _failing_rows(arr, lambda a: pc.cast(a, target))
                new_bad = bad & ~bad_all
                reasons[new_bad] = f"Cast: value in column {col!r} cannot be cast to {type_name}"
                bad_all |= bad
                out = pc.cast(pc.if_else(pa.array(bad), pa.nulls(len(arr), arr.type), arr), target)
            if bf16:
                out = _to_bf16(out)
            table = table.set_column(i, self._out_field(col, out.type if not bf16 else target, bf16), out)
        return mark_errors(table, bad_all, reasons)


def _to_bf16(arr: pa.Array) -> pa.Array:
    """float32 (or list of float32) -> uint16 bit patterns, keeping nulls and offsets."""
    if _list_like(arr.type):
        values = arr.values if not pa.types.is_fixed_size_list(arr.type) else arr.flatten()
        bits = _to_bf16(values)
        if pa.types.is_fixed_size_list(arr.type):
            return pa.FixedSizeListArray.from_arrays(bits, arr.type.list_size, mask=arr.is_null())
        cls = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
        return cls.from_arrays(arr.offsets, bits, mask=arr.is_null())
    np_vals = arr.fill_null(0).to_numpy(zero_copy_only=False)
    return pa.array(to_bfloat16_bits(np_vals), pa.uint16(), mask=arr.is_null().to_numpy(zero_copy_only=False))


@dataclasses.dataclass(frozen=True)
class Filter(Transform):
    """Keeps rows for which ``expr`` is true (null counts as false).

    ``expr`` uses a small safe language compiled to an Arrow expression, never
    ``eval``: column names (``col("name with spaces")`` for odd names),
    literals, comparisons, ``in [..]``, ``and``/``or``/``not``, ``+ - * /``,
    ``is_null(col)`` / ``is_valid(col)``. Example: ``"age >= 18 and country in ['DE', 'FR']"``.
    Rows already marked bad are kept so the pipeline can count them.

    Args:
        expr: The predicate.
    """

    name: ClassVar[str] = "filter"
    expr: str

    def __post_init__(self) -> None:
        compile_expression(self.expr, label=self._label())

    def _compiled(self) -> tuple[pc.Expression, list[str]]:
        return compile_expression(self.expr, label=self._label())

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        expression, cols = self._compiled()
        for c in cols:
            self._require(schema, c, arg="expr")
        try:
            schema.empty_table().filter(expression)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError,
                OverflowError) as e:
            msg = short_repr(str(e).splitlines()[0] if str(e) else type(e).__name__)
            types = ", ".join(f"{c}: {schema.field(c).type}" for c in cols)
            raise self._spec_error(
                f"expression {short_repr(self.expr)} does not type-check against the columns ({types}): "
                f"{msg}. It must be a boolean condition comparing compatible types."
            ) from None
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        expression, _ = self._compiled()
        if ERROR_COLUMN in table.column_names:
            expression = expression | pc.field(ERROR_COLUMN).is_valid()
        try:
            return table.filter(expression)
        except (pa.ArrowInvalid, OverflowError):
            # A value the expression cannot handle (division by zero,
            # overflow): keep those rows, marked bad. Vectorised per
            # expression node, so the cost does not grow with the bad rows.
            mask, bad = evaluate_with_errors(self.expr, table, label=self._label())
            keep = pc.fill_null(mask, False)
            if ERROR_COLUMN in table.column_names:
                keep = pc.or_(keep, pc.is_valid(table.column(ERROR_COLUMN)))
            keep = pc.or_(keep, pa.array(bad))
            marked = mark_errors(table, bad, f"Filter: expression {short_repr(self.expr)} failed on this row")
            return marked.filter(keep)


# -- fill, scaling, hashing, vocabularies, deduplication ------------------------


def _numeric_columns(self: Transform, schema: pa.Schema, columns: Sequence[str]) -> None:
    for c in columns:
        self._require(schema, c, kinds=("numeric",), arg="columns")


def _float_type(self: Transform, dtype: str) -> pa.DataType:
    if dtype not in ("float32", "float64"):
        raise self._spec_error(f"dtype must be float32 or float64; got {dtype!r}")
    return pa.float32() if dtype == "float32" else pa.float64()


@dataclasses.dataclass(frozen=True)
class FillNull(Transform):
    """Replaces nulls with constants.

    Args:
        values: ``{column: value}``; the value must be castable to the column type.
    """

    name: ClassVar[str] = "fill_null"
    values: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _check_mapping(self, self.values, "values"))

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for c, v in self.values.items():
            t = self._require(schema, c, arg="values")
            try:
                pa.scalar(v).cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                raise self._spec_error(
                    f"fill value {v!r} for column {c!r} cannot be cast to the column type {t}"
                ) from None
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        for c, v in self.values.items():
            i = table.column_names.index(c)
            col = table.column(i)
            table = table.set_column(i, table.schema.field(i), col.fill_null(pa.scalar(v).cast(col.type)))
        return table


@dataclasses.dataclass(frozen=True)
class Standardize(Transform):
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
    needs_fit: ClassVar[bool] = True
    columns: tuple[str, ...]
    dtype: str = "float32"
    mean: dict[str, float] | None = None
    std: dict[str, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _tuple_of_str(self, self.columns, "columns"))
        _float_type(self, self.dtype)
        for k in ("mean", "std"):
            v = getattr(self, k)
            if v is not None:
                v = _check_mapping(self, v, k)
                missing = [c for c in self.columns if c not in v]
                if missing:
                    raise self._spec_error(f"{k} has no value for column {missing[0]!r}")
                object.__setattr__(self, k, {c: float(v[c]) for c in self.columns})

    @property
    def is_fitted(self) -> bool:
        return self.mean is not None and self.std is not None

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        _numeric_columns(self, schema, self.columns)
        t = _float_type(self, self.dtype)
        for c in self.columns:
            schema = schema.set(schema.get_field_index(c), pa.field(c, t))
        return schema

    def fit(self, ds: "ray.data.Dataset") -> "Standardize":
        from ray.data.aggregate import Mean, Std

        aggs = []
        for c in self.columns:
            aggs += [Mean(c, alias_name=f"mean/{c}"), Std(c, ddof=0, alias_name=f"std/{c}")]
        r = ds.aggregate(*aggs)
        mean = {c: _finite(r[f"mean/{c}"], 0.0) for c in self.columns}
        std = {c: _finite(r[f"std/{c}"], 0.0) for c in self.columns}
        return dataclasses.replace(self, mean=mean, std=std)

    def stats(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std} if self.is_fitted else {}

    def __call__(self, table: pa.Table) -> pa.Table:
        if not self.is_fitted:
            raise self._spec_error("needs fit(ds) (or mean and std in the spec) before use")
        t = _float_type(self, self.dtype)
        for c in self.columns:
            i = table.column_names.index(c)
            x = pc.cast(table.column(i), pa.float64())
            s = self.std[c] or 1.0  # type: ignore[index]
            y = pc.divide(pc.subtract(x, self.mean[c]), s)  # type: ignore[index]
            table = table.set_column(i, pa.field(c, t), pc.cast(y, t))
        return table


def _finite(v: Any, default: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return f if np.isfinite(f) else default


@dataclasses.dataclass(frozen=True)
class MinMaxScale(Transform):
    """``(x - min) / (max - min)`` per column into [0, 1], fitted over the dataset.

    :meth:`fit` runs one Ray aggregation (``Min``, ``Max``). A constant column
    maps to 0. Nulls stay null.

    Args:
        columns: Numeric columns.
        dtype: ``float32`` (default) or ``float64``.
        min: ``{column: min}`` (fitted). max: ``{column: max}`` (fitted).
    """

    name: ClassVar[str] = "min_max_scale"
    needs_fit: ClassVar[bool] = True
    columns: tuple[str, ...]
    dtype: str = "float32"
    min: dict[str, float] | None = None
    max: dict[str, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _tuple_of_str(self, self.columns, "columns"))
        _float_type(self, self.dtype)
        for k in ("min", "max"):
            v = getattr(self, k)
            if v is not None:
                v = _check_mapping(self, v, k)
                missing = [c for c in self.columns if c not in v]
                if missing:
                    raise self._spec_error(f"{k} has no value for column {missing[0]!r}")
                object.__setattr__(self, k, {c: float(v[c]) for c in self.columns})

    @property
    def is_fitted(self) -> bool:
        return self.min is not None and self.max is not None

    output_schema = Standardize.output_schema

    def fit(self, ds: "ray.data.Dataset") -> "MinMaxScale":
        from ray.data.aggregate import Max, Min

        aggs = []
        for c in self.columns:
            aggs += [Min(c, alias_name=f"min/{c}"), Max(c, alias_name=f"max/{c}")]
        r = ds.aggregate(*aggs)
        return dataclasses.replace(
            self,
            min={c: _finite(r[f"min/{c}"], 0.0) for c in self.columns},
            max={c: _finite(r[f"max/{c}"], 0.0) for c in self.columns},
        )

    def stats(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max} if self.is_fitted else {}

    def __call__(self, table: pa.Table) -> pa.Table:
        if not self.is_fitted:
            raise self._spec_error("needs fit(ds) (or min and max in the spec) before use")
        t = _float_type(self, self.dtype)
        for c in self.columns:
            i = table.column_names.index(c)
            lo, hi = self.min[c], self.max[c]  # type: ignore[index]
            x = pc.cast(table.column(i), pa.float64())
            y = pc.divide(pc.subtract(x, lo), (hi - lo) or 1.0)
            table = table.set_column(i, pa.field(c, t), pc.cast(y, t))
        return table


_P = np.uint64(0x100000001B3)


def hash64(arr: pa.Array | pa.ChunkedArray, *, salt: str = "") -> np.ndarray:
    """A stable 64-bit hash per value (uint64), vectorised; nulls hash to 0.

    Strings/binary: a polynomial hash over the bytes (one ``np.add.reduceat``
    over the values buffer) finalised with splitmix64; integers, floats,
    booleans and dates: splitmix64 of their bit pattern. Stable across
    processes and runs (never Python's ``hash``).
    """
    from slicefeed.transforms._arrays import list_parts
    from slicefeed.transforms._base import _mix64, _str_hash64

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    base = np.uint64(_str_hash64("hash64/" + salt))
    with np.errstate(over="ignore"):
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            values, offsets, valid = list_parts(arr)
            lengths = np.diff(offsets)
            n = len(lengths)
            h = np.zeros(n, np.uint64)
            if values.size:
                maxlen = int(lengths.max())
                powers = np.empty(maxlen, np.uint64)
                powers[0] = 1
                if maxlen > 1:
                    # P^k mod 2^64, cumulative product wraps in uint64.
                    powers[1:] = _P
                    powers = np.cumprod(powers, dtype=np.uint64)
                from slicefeed.transforms._arrays import segment_arange

                pos = segment_arange(lengths)
                from_end = np.repeat(lengths, lengths) - 1 - pos
                terms = (values.astype(np.uint64) + np.uint64(1)) * powers[from_end]
                nz = lengths > 0
                sums = np.add.reduceat(terms, offsets[:-1][nz]) if nz.any() else np.zeros(0, np.uint64)
                h[nz] = sums
            h = _mix64(_mix64(h ^ base) ^ lengths.astype(np.uint64))
        else:
            valid = np.ones(len(arr), bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
            if pa.types.is_boolean(t):
                bits = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
            elif pa.types.is_floating(t):
                f = arr.cast(pa.float64()).fill_null(0).to_numpy()
                bits = (f + 0.0).view(np.uint64)  # -0.0 and 0.0 hash alike
            elif pa.types.is_integer(t) or pa.types.is_temporal(t):
                bits = arr.cast(pa.int64()).fill_null(0).to_numpy().view(np.uint64)
            else:
                raise TypeError(f"cannot hash values of type {t}")
            h = _mix64(_mix64(bits ^ base))
    return np.where(valid, h, np.uint64(0))


@dataclasses.dataclass(frozen=True)
class HashBucket(Transform):
    """Maps values to ``num_buckets`` buckets with a stable hash (int32 ids).

    Args:
        column: String, binary, integer, float, boolean or temporal column.
        num_buckets: Number of buckets.
        output: Output column (default: replace ``column``).
        salt: Mixed into the hash (different salts give independent bucketings).
    Nulls stay null.
    """

    name: ClassVar[str] = "hash_bucket"
    column: str
    num_buckets: int
    output: str | None = None
    salt: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.num_buckets, bool) or not isinstance(self.num_buckets, int) or not 0 < self.num_buckets < 2**31:
            raise self._spec_error(f"num_buckets must be an integer in [1, 2^31); got {self.num_buckets!r}")

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._require(schema, self.column)
        if not (
            _is_hashable(t)
        ):
            raise self._spec_error(
                f"column {self.column!r} has type {t}; expected string, binary, integer, "
                "float, boolean or temporal values"
            )
        f = pa.field(self.output or self.column, pa.int32())
        if f.name in schema.names:
            return schema.set(schema.get_field_index(f.name), f)
        return schema.append(f)

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        h = hash64(col, salt=self.salt)
        ids = (h % np.uint64(self.num_buckets)).astype(np.int32)
        valid = col.is_valid()
        out = pa.array(ids, mask=pc.invert(valid).to_numpy(zero_copy_only=False) if col.null_count else None)
        name = self.output or self.column
        f = pa.field(name, pa.int32())
        if name in table.column_names:
            return table.set_column(table.column_names.index(name), f, out)
        return table.append_column(f, out)


def _is_hashable(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_temporal(t)
    )


@dataclasses.dataclass(frozen=True)
class Vocabulary(Transform):
    """Maps values (or list elements) to int32 ids from a fitted vocabulary.

    :meth:`fit` counts values over the whole dataset (Ray ``groupby().count()``)
    and keeps the ``top_k`` most frequent with at least ``min_count``
    occurrences; ties are broken by value, so the vocabulary is deterministic.
    Known values get ids ``first_id, first_id + 1, ...`` in that order; other
    values get ``oov_id``. Nulls stay null.

    Args:
        column: String or integer column, or a list of them.
        top_k: Vocabulary size limit (None: all values).
        min_count: Minimum number of occurrences.
        oov_id: Id for out-of-vocabulary values.
        first_id: Id of the most frequent value.
        output: Output column (default: replace ``column``).
        vocab: The vocabulary (fitted; give it in the spec to skip fitting).
    """

    name: ClassVar[str] = "vocabulary"
    needs_fit: ClassVar[bool] = True
    column: str
    top_k: int | None = None
    min_count: int = 1
    oov_id: int = 0
    first_id: int = 1
    output: str | None = None
    vocab: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise self._spec_error(f"top_k must be a positive integer; got {self.top_k!r}")
        if self.vocab is not None:
            object.__setattr__(self, "vocab", tuple(self.vocab))
            if len(set(self.vocab)) != len(self.vocab):
                raise self._spec_error("vocab contains duplicates")
            if self.first_id <= self.oov_id < self.first_id + len(self.vocab):
                raise self._spec_error(
                    f"oov_id {self.oov_id} collides with the vocabulary ids "
                    f"[{self.first_id}, {self.first_id + len(self.vocab)})"
                )

    @property
    def is_fitted(self) -> bool:
        return self.vocab is not None

    def _value_type(self, schema: pa.Schema) -> pa.DataType:
        t = self._require(schema, self.column)
        vt = t.value_type if _list_like(t) else t
        if not (pa.types.is_string(vt) or pa.types.is_large_string(vt) or pa.types.is_integer(vt)):
            raise self._spec_error(
                f"column {self.column!r} has type {t}; expected string or integer values "
                "(or lists of them)"
            )
        return t

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._value_type(schema)
        out_t = _with_value_type(t, pa.int32()) if _list_like(t) else pa.int32()
        f = pa.field(self.output or self.column, out_t)
        if f.name in schema.names:
            return schema.set(schema.get_field_index(f.name), f)
        return schema.append(f)

    def fit(self, ds: "ray.data.Dataset") -> "Vocabulary":
        """Counts values over all of ``ds`` and keeps the top ``top_k``.

        Each Ray task counts the values of its blocks (``pyarrow`` group-by,
        flattening list columns); the driver merges the partial counts as they
        stream in, so its memory is bounded by the number of distinct values,
        not rows. (A Ray ``groupby().count()`` shuffle gives the same result
        but took ~4x longer on the CI machine for small vocabularies.)
        """
        col = self.column

        def partial(batch: pa.Table) -> pa.Table:
            c = batch.column(col)
            if _list_like(c.type):
                c = pc.list_flatten(c)
            t = pa.table({"v": c}).filter(pc.is_valid(c))
            g = t.group_by("v", use_threads=False).aggregate([([], "count_all")])
            return g.select(["v", "count_all"]).rename_columns(["v", "n"])

        merged: pa.Table | None = None
        pending: list[pa.Table] = []
        parts = ds.select_columns([col]).map_batches(partial, batch_format="pyarrow", batch_size=None)
        for b in parts.iter_batches(batch_format="pyarrow", batch_size=None):
            pending.append(b)
            if sum(p.num_rows for p in pending) > 1_000_000:
                merged = _merge_counts([merged, *pending])
                pending = []
        merged = _merge_counts([merged, *pending])
        if merged is None or merged.num_rows == 0:
            return dataclasses.replace(self, vocab=())
        tbl = merged.filter(pc.greater_equal(merged.column("n"), self.min_count))
        tbl = tbl.sort_by([("n", "descending"), ("v", "ascending")])
        if self.top_k is not None:
            tbl = tbl.slice(0, self.top_k)
        return dataclasses.replace(self, vocab=tuple(tbl.column("v").to_pylist()))

    def stats(self) -> dict[str, Any]:
        if not self.is_fitted:
            return {}
        return {
            "size": len(self.vocab),  # type: ignore[arg-type]
            "oov_id": self.oov_id,
            "first_id": self.first_id,
            "head": list(self.vocab[:20]),  # type: ignore[index]
        }

    def __call__(self, table: pa.Table) -> pa.Table:
        if not self.is_fitted:
            raise self._spec_error("needs fit(ds) (or vocab in the spec) before use")
        col = table.column(self.column)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        is_list = _list_like(col.type)
        vals = col.flatten() if is_list else col
        vset = pa.array(list(self.vocab), type=vals.type) if self.vocab else pa.array([], vals.type)  # type: ignore[arg-type]
        idx = pc.index_in(vals, value_set=vset)
        ids = pc.if_else(
            pc.is_valid(vals),
            pc.fill_null(pc.add(pc.cast(idx, pa.int32()), pa.scalar(self.first_id, pa.int32())), pa.scalar(self.oov_id, pa.int32())),
            pa.nulls(len(vals), pa.int32()),
        )
        out = _rebuild_list(col, ids) if is_list else ids
        name = self.output or self.column
        f = pa.field(name, out.type)
        if name in table.column_names:
            return table.set_column(table.column_names.index(name), f, out)
        return table.append_column(f, out)


def _merge_counts(tables: list[pa.Table | None]) -> pa.Table | None:
    ts = [t for t in tables if t is not None and t.num_rows]
    if not ts:
        return None
    t = pa.concat_tables(ts, promote_options="permissive")
    g = t.group_by("v", use_threads=False).aggregate([("n", "sum")])
    return g.select(["v", "n_sum"]).rename_columns(["v", "n"])


def _rebuild_list(col: pa.Array, flat_ids: pa.Array) -> pa.Array:
    """``col``'s list structure around new flattened values."""
    t = col.type
    if pa.types.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(flat_ids, t.list_size, mask=col.is_null() if col.null_count else None)
    from slicefeed.transforms._arrays import list_parts

    _, offsets, valid = list_parts(col)
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    otype = pa.int64() if pa.types.is_large_list(t) else pa.int32()
    return cls.from_arrays(pa.array(offsets, otype), flat_ids, mask=pa.array(~valid) if not valid.all() else None)


@dataclasses.dataclass(frozen=True)
class Deduplicate(Transform):
    """Exact deduplication on ``columns`` (all data columns when omitted).

    A dataset-level operation (``is_dataset_op``): the pipeline calls
    ``ds = t.dataset_op(ds)``, which groups the whole dataset by the key
    columns (Ray ``groupby().map_groups()``, a shuffle) and keeps, per key, the
    row with the smallest (``_sf_file``, ``_sf_row``), so the survivor does not
    depend on scheduling. Rows come out grouped by key. Called on a table
    (``t(table)``), it deduplicates within that table only. Nulls are equal to
    each other for this purpose.

    Args:
        columns: Key columns (strings, binary, numbers, booleans, dates).
    """

    name: ClassVar[str] = "deduplicate"
    is_dataset_op: ClassVar[bool] = True
    columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.columns is not None:
            object.__setattr__(self, "columns", _tuple_of_str(self, self.columns, "columns"))

    def _keys(self, names: Sequence[str]) -> list[str]:
        if self.columns is not None:
            return list(self.columns)
        return [n for n in names if n not in RESERVED_COLUMNS]

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for c in self._keys(schema.names):
            t = self._require(schema, c, arg="columns")
            if not _is_hashable(t):
                raise self._spec_error(
                    f"column {c!r} has type {t}; deduplicate on scalar columns (strings, "
                    "binary, numbers, booleans, dates), e.g. columns: [text]"
                )
        return schema

    def _key_hash(self, table: pa.Table) -> pa.Array:
        h = np.zeros(table.num_rows, np.uint64)
        from slicefeed.transforms._base import _mix64

        with np.errstate(over="ignore"):
            for c in self._keys(table.column_names):
                h = _mix64(h ^ hash64(table.column(c), salt=c))
        return pa.array(h)

    def _order(self, table: pa.Table) -> list[tuple[str, str]]:
        return [(c, "ascending") for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c in table.column_names]

    def __call__(self, table: pa.Table) -> pa.Table:
        keys = self._keys(table.column_names)
        order = self._order(table)
        if order:
            table = table.sort_by(order)
        # Exact: group by the key columns themselves; first row per key in order.
        idx = pa.array(np.arange(table.num_rows, dtype=np.int64))
        tmp = table.select(keys).append_column("__sf_idx", idx)
        firsts = tmp.group_by(keys, use_threads=False).aggregate([("__sf_idx", "min")])
        keep = np.sort(firsts.column("__sf_idx_min").to_numpy())
        return table.take(pa.array(keep))

    def dataset_op(self, ds: "ray.data.Dataset") -> "ray.data.Dataset":
        keys_hash = self._key_hash

        def add_key(batch: pa.Table) -> pa.Table:
            return batch.append_column("__sf_key", keys_hash(batch))

        dedup = self

        def per_group(group: pa.Table) -> pa.Table:
            return dedup(group.drop_columns(["__sf_key"]))

        # Group by a 64-bit hash of the keys (one scalar, nulls allowed); exact
        # comparison of the real key columns happens within each group.
        return ds.map_batches(add_key, batch_format="pyarrow").groupby("__sf_key").map_groups(
            per_group, batch_format="pyarrow"
        )
