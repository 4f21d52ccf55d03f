"""Categorical columns: HashBucket (stable hashing) and Vocabulary (fitted ids)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import printable, short_repr
from slicefeed.transforms._arrays import (
    fixed_values,
    is_tensor,
    list_like,
    list_parts,
    rebuild_like,
    with_value_type,
)
from slicefeed.transforms._contract import Transform
from slicefeed.transforms._hashing import hash64

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


@dataclasses.dataclass(frozen=True)
class HashBucket(Transform):
    """Maps values to ``num_buckets`` buckets with a stable hash (int32 ids).

    Args:
        column: String, binary, integer, float, boolean or temporal (date,
            time, timestamp, duration; not interval) column.
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
            raise self._spec_error(f"num_buckets must be an integer in [1, 2^31); got {short_repr(self.num_buckets)}")

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._require(schema, self.column)
        if not (
            is_hashable(t)
        ):
            raise self._spec_error(
                f"column {short_repr(self.column)} has type {t}; expected string, binary, integer, "
                "float, boolean, date, time, timestamp or duration values"
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


def is_hashable(t: pa.DataType) -> bool:
    """Whether :func:`hash64` (and so HashBucket and Deduplicate) accepts ``t``."""
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or (pa.types.is_temporal(t) and not pa.types.is_interval(t))
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
        first_id: Id of the most frequent value. Every id (``oov_id`` and
            ``first_id .. first_id + len(vocab) - 1``) must fit int32.
        output: Output column (default: replace ``column``).
        vocab: The vocabulary (fitted; give it in the spec to skip fitting).
            Its values must have the column's kind: strings for a string
            column (quote ``yes``, ``no`` and codes like ``02139`` in YAML),
            integers in the column type's range for an integer column; the
            schema check refuses others.
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
            raise self._spec_error(f"top_k must be a positive integer; got {short_repr(self.top_k)}")
        # Ids are int32: an id outside its range would wrap in Arrow's add and
        # could equal oov_id or another value's id.
        for arg in ("first_id", "oov_id"):
            v = getattr(self, arg)
            if isinstance(v, bool) or not isinstance(v, int) or not _I32_MIN <= v <= _I32_MAX:
                raise self._spec_error(
                    f"{arg} {short_repr(v)} does not fit int32 (the id type): give an integer in "
                    f"[{_I32_MIN}, {_I32_MAX}]"
                )
        if self.vocab is not None:
            object.__setattr__(self, "vocab", tuple(self.vocab))
            if len(set(self.vocab)) != len(self.vocab):
                raise self._spec_error("vocab contains duplicates")
            last = self.first_id + len(self.vocab) - 1
            if last > _I32_MAX:
                raise self._spec_error(
                    f"first_id {self.first_id} with {len(self.vocab)} vocab values gives ids up to "
                    f"{last}, beyond int32 (the id type, at most {_I32_MAX}): lower first_id "
                    f"(or top_k)"
                )
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
        vt = t.value_type if list_like(t) else t
        if not (pa.types.is_string(vt) or pa.types.is_large_string(vt) or pa.types.is_integer(vt)):
            raise self._spec_error(
                f"column {short_repr(self.column)} has type {t}; expected string or integer values "
                "(or lists of them)"
            )
        return t

    def _check_vocab(self, value_type: pa.DataType) -> None:
        """Raises a SpecError unless every vocab value is of ``value_type``'s kind
        (``str`` for a string column, ``int`` in range for an integer one).

        YAML reads ``yes``/``no`` as booleans and ``02139``-like codes as
        numbers, which can never equal a string value; the check names both types.
        """
        if not self.vocab:
            return
        is_str = pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
        want, kind = (str, "string") if is_str else ((int, np.integer), "integer")
        bad = next((v for v in self.vocab if isinstance(v, bool) or not isinstance(v, want)), None)
        col = printable(self.column, 200)
        if bad is not None:
            advice = ("in YAML, quote them (vocab: ['yes', 'no', '02139'])" if is_str
                      else "in YAML, leave them unquoted (vocab: [3, 7]), or cast the column to string first")
            raise self._spec_error(
                f"vocab for column {short_repr(col)} ({value_type}) holds {type(bad).__name__} values "
                f"(first: {short_repr(bad)}); a{'n' * (not is_str)} {kind} column needs {kind} values: {advice}"
            )
        if not is_str:
            info = np.iinfo(value_type.to_pandas_dtype())
            out = next((v for v in self.vocab if not info.min <= v <= info.max), None)
            if out is not None:
                raise self._spec_error(
                    f"vocab value {short_repr(out)} does not fit column {short_repr(col)} ({value_type}), so it "
                    f"can never match: remove it, or cast the column to a wider integer type first"
                )

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._value_type(schema)
        if self.vocab is not None:
            self._check_vocab(t.value_type if list_like(t) else t)
        out_t = with_value_type(t, pa.int32()) if list_like(t) else pa.int32()
        f = pa.field(self.output or self.column, out_t)
        if f.name in schema.names:
            return schema.set(schema.get_field_index(f.name), f)
        return schema.append(f)

    def fit(self, ds: ray.data.Dataset) -> Vocabulary:
        """Counts values over all of ``ds`` and keeps the top ``top_k``.

        Each Ray task counts the values of its blocks (``pyarrow`` group-by,
        flattening list columns); the driver merges the partial counts as they
        stream in, so its memory is bounded by the number of distinct values,
        not rows. (A Ray ``groupby().count()`` shuffle gives the same result
        but needs a shuffle, which is several times slower for small vocabularies.)
        """
        col = self.column

        def partial(batch: pa.Table) -> pa.Table:
            c = batch.column(col)
            if list_like(c.type):
                c = _flat(c.filter(pc.is_valid(c)) if c.null_count else c)
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
        is_list = list_like(col.type)
        vals = _flat(col) if is_list else col
        try:
            vset = pa.array(list(self.vocab), type=vals.type)  # type: ignore[arg-type]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            # The schema check refuses such a vocab; named here too for a
            # caller that applies the transform without it.
            self._check_vocab(vals.type)
            raise
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


def _flat(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The values of a list column's rows (a fixed-size list's or tensor's null
    rows keep their slots, so :func:`_rebuild_list` can put them back)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_fixed_size_list(col.type) or is_tensor(col.type):
        return fixed_values(col)
    return col.flatten()


def _rebuild_list(col: pa.Array, flat_ids: pa.Array) -> pa.Array:
    """``col``'s list structure around new flattened values."""
    t = col.type
    if pa.types.is_fixed_size_list(t) or is_tensor(t):
        return rebuild_like(col, flat_ids)
    _, offsets, valid = list_parts(col)
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    otype = pa.int64() if pa.types.is_large_list(t) else pa.int32()
    return cls.from_arrays(pa.array(offsets, otype), flat_ids, mask=pa.array(~valid) if not valid.all() else None)
