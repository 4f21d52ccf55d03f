"""Column operations: Select, Rename, Cast, Filter, FillNull."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import (
    ERROR_COLUMN,
    RESERVED_COLUMNS,
    printable,
    short_repr,
    typed_columns,
)
from slicefeed.connectors._values import INFINITY_TEXT
from slicefeed.transforms._arrays import (
    failing_rows,
    fixed_values,
    is_tensor,
    leaf_rows,
    leaf_type,
    list_like,
    rows_of,
    tensor_storage,
    with_value_type,
)
from slicefeed.transforms._badrecords import mark_errors
from slicefeed.transforms._contract import Transform
from slicefeed.transforms._dtypes import BFLOAT16, bfloat16_field, parse_type, to_bfloat16_bits
from slicefeed.transforms._expr import (
    canonical_expression,
    compile_expression,
    evaluate_with_errors,
)


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
    reads_only: ClassVar[bool] = True
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", self._column_list(self.columns, "columns"))

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
        m = self._column_mapping(self.mapping, "mapping")
        if not all(isinstance(v, str) and v for v in m.values()):
            raise self._spec_error(f"mapping values must be new column names; got {short_repr(m)}")
        for k, v in m.items():
            if k in RESERVED_COLUMNS or v in RESERVED_COLUMNS:
                raise self._spec_error(
                    f"cannot rename to or from slicefeed's own column {short_repr(k if k in RESERVED_COLUMNS else v)}"
                )
        targets = list(m.values())
        dup = sorted({t for t in targets if targets.count(t) > 1})
        if dup:
            raise self._spec_error(f"mapping renames two columns to {short_repr(dup[0])}")
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
                    f"renaming {short_repr(old)} to {short_repr(new)} collides with the existing column {short_repr(new)}; "
                    f"drop or rename {short_repr(new)} first"
                )
        return pa.schema(
            [f.with_name(self.mapping.get(f.name, f.name)) for f in schema], schema.metadata
        )

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.rename_columns(self._names(table.column_names))


@dataclasses.dataclass(frozen=True)
class Cast(Transform):
    """Casts columns to other types (safe casts: overflow or unparsable values are errors).

    A value that cannot be cast (``"abc"`` to ``int32``, ``300`` to ``uint8``)
    marks its row bad instead of failing the batch. A list column cast to a
    scalar type casts its values (``list<int64>`` -> ``list<int32>``); a row
    is bad when one of its own values cannot be cast.

    Casts to a float type: a finite value beyond the target's range (``1e300``
    or ``-3.5e38`` to ``float32``, ``70000`` to ``float16``) would become
    infinite, an overflow that marks its row bad; inf and NaN stay inf and NaN.
    A finite value within range is rounded to the nearest value of the target
    (``0.1`` is no ``float32``, ``2**53 + 1`` no ``float64``): the precision a
    float cast gives up, not an error, for integers as for floats (as NumPy's
    ``astype`` and the loader's ``dtypes`` round).

    Other values a cast would change without Arrow refusing them mark their row
    bad too:

    - Hexadecimal text (``"0xff"``, ``"0XFF"``) is the non-negative number it
      writes, 255, not the target's bit pattern Arrow makes of it (-1 as
      ``int8``): one beyond a signed target's range is bad (``"0x80"`` to
      ``int8``, ``"0xffffffffffffffff"`` to ``int64``; it fits ``uint64``).
      Arrow reads at most two hex digits per byte of the target, so hex text
      with more (``"0x007f"`` to ``int8``) and a signed one (``"-0x10"``) do
      not cast at all.
    - A number cast to ``bool`` must be 0 or 1 (``-0.0`` is 0); 2, -1, 0.5 and
      NaN are bad rather than True (Python's ``bool()``), as in the loader's
      bool ``dtypes``: a flag holding 2 is a data error, not a truth value.
    - A timestamp cast to ``date32`` must be exactly midnight (local midnight
      for a timestamp with a time zone, whose date Arrow takes in that zone);
      a time of day would be dropped, as a fraction of a second would be by a
      cast to a coarser timestamp unit, which is bad as well.
    ``"bfloat16"`` stores bfloat16 bit patterns as ``uint16`` with field
    metadata (see :mod:`slicefeed.transforms._dtypes`).

    Args:
        columns: ``{column: type}`` with types such as ``int32``, ``float32``,
            ``bfloat16``, ``string``, ``bool``, ``timestamp[us]``.
    """

    name: ClassVar[str] = "cast"
    columns: dict[str, str]

    def __post_init__(self) -> None:
        m = self._column_mapping(self.columns, "columns")
        for col, t in m.items():
            parse_type(t, label=self._label(), arg=f"column {short_repr(col)}")
        object.__setattr__(self, "columns", m)

    def _target(self, col: str, src: pa.DataType) -> tuple[pa.DataType, bool]:
        """(Arrow type to cast to, is bfloat16) for ``col`` of type ``src``."""
        t = parse_type(self.columns[col], label=self._label(), arg=f"column {short_repr(col)}")
        bf16 = t == BFLOAT16
        scalar = pa.float32() if bf16 else t
        if list_like(src) and not list_like(scalar):
            return with_value_type(src, scalar), bf16
        return scalar, bf16

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        fields = list(schema)
        for col in self.columns:
            src = self._require(schema, col, arg="columns")
            target, bf16 = self._target(col, src)
            try:
                pc.cast(pa.array([], _storage_type(src)), _storage_type(target))
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                raise self._spec_error(
                    f"cannot cast column {short_repr(col)} from {printable(str(src), 200)} to "
                    f"{printable(str(self.columns[col]), 200)}"
                ) from None
            if bf16 and not (
                pa.types.is_floating(target)
                or pa.types.is_integer(target)
                or (list_like(target))
            ):
                raise self._spec_error(
                    f"bfloat16 needs a numeric column; {short_repr(col)} is {printable(str(src), 200)}")
            i = schema.get_field_index(col)
            fields[i] = self._out_field(col, target, bf16)
        return pa.schema(fields, schema.metadata)

    @staticmethod
    def _out_field(col: str, target: pa.DataType, bf16: bool) -> pa.Field:
        if not bf16:
            return pa.field(col, target)
        if list_like(target):
            return bfloat16_field(col, with_value_type(target, pa.uint16()))
        return bfloat16_field(col)

    def __call__(self, table: pa.Table) -> pa.Table:
        bad_all = np.zeros(table.num_rows, dtype=bool)
        reasons = np.full(table.num_rows, None, dtype=object)
        for col, type_name in self.columns.items():
            i = table.schema.get_field_index(col)
            arr = table.column(i).combine_chunks()
            target, bf16 = self._target(col, arr.type)
            # A tensor column is cast through its fixed_size_list storage: the
            # shape stays, only the value type changes.
            tensor = target if is_tensor(target) else None
            if tensor is not None:
                arr, target = tensor_storage(arr), target.storage_type
            bad = np.zeros(len(arr), dtype=bool)
            # An integer cast to a float rounds, as a float cast does (Arrow's
            # safe cast refuses integers beyond the float's exact range).
            safe = not (pa.types.is_integer(leaf_type(arr.type))
                        and pa.types.is_floating(leaf_type(target)))
            try:
                out = pc.cast(arr, target, safe=safe)
            except (pa.ArrowInvalid, OverflowError):
                bad = _uncastable_rows(arr, target, safe)
                reasons[bad & ~bad_all] = (
                    f"Cast: value in column {short_repr(col)} cannot be cast to {type_name}"
                )
                # The bad rows become null. if_else also rewrites the child
                # slots under null rows, which the cast would otherwise cast
                # too (a fixed-size list's slots hold anything there).
                arr = pc.if_else(pa.array(bad), pa.nulls(len(arr), arr.type), arr)
                out = pc.cast(arr, target, safe=safe)
            if bf16:
                out = _to_bf16(out)
            for check, why in _LOSSY_CASTS:
                lost = check(arr, out, bf16) & ~bad
                if lost.any():
                    reasons[lost & ~bad_all] = (
                        f"Cast: value in column {short_repr(col)} " + why.format(type_name)
                    )
                    bad |= lost
                    out = pc.if_else(pa.array(lost), pa.nulls(len(out), out.type), out)
            bad_all |= bad
            if tensor is not None:
                out = pa.ExtensionArray.from_storage(
                    with_value_type(tensor, out.type.value_type), out
                )
            table = table.set_column(i, self._out_field(col, out.type, bf16), out)
        return mark_errors(table, bad_all, reasons)


def _uncastable_rows(arr: pa.Array, target: pa.DataType, safe: bool = True) -> np.ndarray:
    """Rows of ``arr`` holding a value the cast to ``target`` refuses (error path).

    A list or tensor column is bisected over its leaf values, each cast alone
    to the target's value type, and the failing ones mapped to their rows: a
    cast of a sliced list also casts child values outside the slice."""
    leaf_target = leaf_type(target)
    leaves, row = leaf_rows(arr)
    bad_leaves = failing_rows(leaves, lambda a: pc.cast(a, leaf_target, safe=safe))
    return rows_of(bad_leaves, row, len(arr))


def _leaf_pair(src: pa.Array, out: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """``(source leaves, cast leaves, row of each)`` of a cast: the same rows, so
    the same leaves in the same order (an extension source as its storage)."""
    leaf_out, row = leaf_rows(out)
    leaf_src, _ = leaf_rows(src)
    if isinstance(leaf_src, pa.ExtensionArray):  # its values are its storage's (leaf_type)
        leaf_src = leaf_src.storage
    if pa.types.is_dictionary(leaf_src.type):
        leaf_src = leaf_src.dictionary_decode()
    return leaf_src, leaf_out, row


def _source_leaf_type(src: pa.Array) -> pa.DataType:
    """The type of a cast source's values (a dictionary's value type: Arrow
    casts a dictionary through its values)."""
    t = leaf_type(src.type)
    return t.value_type if pa.types.is_dictionary(t) else t


def _mask(values: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _hex_wrap_rows(src: pa.Array, out: pa.Array, bf16: bool) -> np.ndarray:
    """Rows where hexadecimal text became a negative number in a signed target.

    Arrow parses ``0x`` text (at most two digits per byte of the target) as
    the target's bit pattern: ``"0xff"`` to int8 is -1. Hex text writes a
    non-negative number (Arrow refuses a sign before ``0x``), so a negative
    result is a value beyond the target's range."""
    none = np.zeros(len(src), dtype=bool)
    src_type = _source_leaf_type(src)
    if not (pa.types.is_signed_integer(leaf_type(out.type))
            and (pa.types.is_string(src_type) or pa.types.is_large_string(src_type))):
        return none
    low = pc.min(leaf_rows(out, rows=False)[0]).as_py()
    if low is None or low >= 0:  # the common case needs no row numbers
        return none
    leaf_src, leaf_out, row = _leaf_pair(src, out)
    wrapped = pc.and_(pc.starts_with(leaf_src, "0x", ignore_case=True), pc.less(leaf_out, 0))
    return rows_of(_mask(wrapped), row, len(src))


def _non_binary_rows(src: pa.Array, out: pa.Array, bf16: bool) -> np.ndarray:
    """Rows where a number other than 0 and 1 became a bool (Arrow, like
    Python's ``bool()``, makes any nonzero number, NaN included, True); the
    loader's bool ``dtypes`` refuse them the same way."""
    none = np.zeros(len(src), dtype=bool)
    src_type = _source_leaf_type(src)
    if not (pa.types.is_boolean(leaf_type(out.type))
            and (pa.types.is_integer(src_type) or pa.types.is_floating(src_type))):
        return none
    leaf_src, _, row = _leaf_pair(src, out)
    if pa.types.is_float16(leaf_src.type):  # compared exactly as float32
        leaf_src = leaf_src.cast(pa.float32())
    binary = pc.or_(pc.equal(leaf_src, 0), pc.equal(leaf_src, 1))
    other = pc.and_(pc.is_valid(leaf_src), pc.invert(pc.fill_null(binary, False)))
    return rows_of(_mask(other), row, len(src))


def _time_of_day_rows(src: pa.Array, out: pa.Array, bf16: bool) -> np.ndarray:
    """Rows where a timestamp that is not exactly midnight became a date: the
    time is lost, as a fraction of a second is when a timestamp narrows its
    unit (which Arrow refuses). A zoned timestamp's date is taken in its zone,
    so the midnight is the local one."""
    none = np.zeros(len(src), dtype=bool)
    src_type = _source_leaf_type(src)
    if not (pa.types.is_timestamp(src_type) and pa.types.is_date(leaf_type(out.type))):
        return none
    leaf_src, _, row = _leaf_pair(src, out)
    if leaf_src.type.tz is not None:
        leaf_src = pc.local_timestamp(leaf_src)
    per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[leaf_src.type.unit]
    ticks = leaf_src.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    return rows_of(ticks % (86_400 * per_second) != 0, row, len(src))


def _overflow_rows(src: pa.Array, out: pa.Array, bf16: bool) -> np.ndarray:
    """Rows where a finite value of ``src`` became infinite in ``out``, its cast
    to a float type (or bfloat16 bits): beyond the target's range, an overflow.

    inf and NaN that were inf and NaN (numbers, or the text ``inf``,
    ``-Infinity``, ``nan``) stay; rounding a finite value to the nearest one
    of a narrower float is what a float cast does, and no error."""
    none = np.zeros(len(src), dtype=bool)
    out_type, src_type = leaf_type(out.type), leaf_type(src.type)
    if not (pa.types.is_uint16(out_type) if bf16 else pa.types.is_floating(out_type)):
        return none
    # Casts whose every value is within the target's range need no check:
    # any int64 is within float32's and bfloat16's (float16's ends at 65504),
    # and a float within a float at least as wide.
    if pa.types.is_integer(src_type) and not pa.types.is_float16(out_type):
        return none
    if pa.types.is_floating(src_type) and (
        src_type.bit_width <= (16 if bf16 else out_type.bit_width)
    ):
        return none
    # The common case, no infinity at all, needs no row numbers.
    if not pc.any(_is_inf(leaf_rows(out, rows=False)[0], bf16)).as_py():
        return none
    leaf_src, leaf_out, row = _leaf_pair(src, out)
    inf = _is_inf(leaf_out, bf16)
    t = leaf_src.type
    if pa.types.is_floating(t):
        was = pc.invert(pc.is_finite(leaf_src))
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        was = pc.match_substring_regex(leaf_src, INFINITY_TEXT)
    else:
        was = pa.array(np.zeros(len(leaf_src), dtype=bool))
    over = pc.and_(inf, pc.invert(pc.fill_null(was, False)))
    return rows_of(pc.fill_null(over, False).to_numpy(zero_copy_only=False), row, len(src))


#: The checks of a cast's result for values it changed without Arrow refusing
#: them, each with the rest of its bad-record reason (``{}``: the type name).
_LOSSY_CASTS = (
    (_overflow_rows, ("overflows {} (a finite value beyond its range); cast to a wider type "
                      "or fix the value")),
    (_hex_wrap_rows, ("does not fit {} (hexadecimal text is the non-negative number it "
                      "writes); cast to a wider type or fix the value")),
    (_non_binary_rows, ("is neither 0 nor 1, the only numbers bool holds; compare it in a "
                        "filter or fix the value")),
    (_time_of_day_rows, ("has a time of day that {} would drop; cast to a timestamp type, or "
                         "truncate the time first")),
)


def _is_inf(values: pa.Array, bf16: bool) -> pa.Array:
    if bf16:
        # bfloat16 bits: the exponent all ones and a zero mantissa is +-inf.
        masked = pc.bit_wise_and(values, pa.scalar(0x7FFF, pa.uint16()))
        return pc.equal(masked, pa.scalar(0x7F80, pa.uint16()))
    return pc.is_inf(values)


def _storage_type(t: pa.DataType) -> pa.DataType:
    return t.storage_type if is_tensor(t) else t


def _to_bf16(arr: pa.Array) -> pa.Array:
    """float32 (or list of float32) -> uint16 bit patterns, keeping nulls and offsets."""
    if list_like(arr.type):
        values = arr.values if not pa.types.is_fixed_size_list(arr.type) else fixed_values(arr)
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
    literals, comparisons, ``in [..]``, ``and``/``or``/``not``, ``+ - * /``
    (``/`` divides as Python does, to float64), ``is_null(col)`` /
    ``is_valid(col)``. Example: ``"age >= 18 and country in ['DE', 'FR']"``.
    Numbers follow Python and NumPy where Arrow differs: ``in`` matches as
    ``==`` does (``-0.0 in [0.0]``), an integer meets a float in float64, and
    a uint64 column meets a non-negative literal in uint64 (see
    :mod:`slicefeed.transforms._expr`). A row the expression cannot be
    evaluated on (division by zero, an integer result beyond its type, a
    uint64 value beyond int64 met with a signed operand) is kept and marked
    bad. Rows already marked bad are kept so the pipeline can count them.

    Args:
        expr: The predicate.
    """

    name: ClassVar[str] = "filter"
    reads_only: ClassVar[bool] = True
    expr: str

    def __post_init__(self) -> None:
        compile_expression(self.expr, label=self._label())

    def _compiled(self, schema: pa.Schema) -> tuple[pc.Expression, list[str]]:
        return _compiled_for(self.expr, self._label(), schema)

    def fingerprint_spec(self) -> dict[str, dict[str, Any]]:
        """The expression by its parsed form: ``x>1`` and ``( x > 1 )`` are one filter."""
        return {self.name: {"expr": canonical_expression(self.expr)}}

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        expression, cols = self._compiled(schema)
        for c in cols:
            self._require(schema, c, arg="expr")
        try:
            schema.empty_table().filter(expression)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError,
                OverflowError) as e:
            msg = short_repr(str(e).splitlines()[0] if str(e) else type(e).__name__)
            types = typed_columns(schema.field(c) for c in cols)
            raise self._spec_error(
                f"expression {short_repr(self.expr)} does not type-check against the columns ({types}): "
                f"{msg}. It must be a boolean condition comparing compatible types."
            ) from None
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        expression, _ = self._compiled(table.schema)
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
            marked = mark_errors(
                table, bad, f"Filter: expression {short_repr(self.expr)} failed on this row"
            )
            return marked.filter(keep)


@functools.lru_cache(maxsize=64)
def _compiled_for(text: str, label: str, schema: pa.Schema) -> tuple[pc.Expression, list[str]]:
    """A filter's expression compiled for a batch schema, once per schema (a
    pipeline's batches share a few)."""
    return compile_expression(text, label=label, schema=schema)


@dataclasses.dataclass(frozen=True)
class FillNull(Transform):
    """Replaces nulls with constants.

    Args:
        values: ``{column: value}``; the value must be castable to the column
            type, and a bool column takes true/false only, as true/false fills
            only a bool column (Arrow would make 2 True and True 1): a finite value beyond a float column's range (``1e300`` for
            ``float32``) is refused, as it would become infinite; inf and NaN
            are taken as they are, and a value within range is rounded to the
            column's precision.
    """

    name: ClassVar[str] = "fill_null"
    values: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", self._column_mapping(self.values, "values"))

    def _fill_value(self, c: str, t: pa.DataType) -> pa.Scalar:
        """The fill value for column ``c`` of type ``t``, cast to it.

        Raises:
            SpecError: the value does not cast, or a finite one becomes infinite.
        """
        v = self.values[c]
        # Arrow casts any nonzero number to True and True to 1: between bool
        # and other types a cast changes what the value means, so the kinds
        # must match (other casts keep the value or are refused below).
        if isinstance(v, bool) != pa.types.is_boolean(t):
            fix = ("fill it with true or false" if pa.types.is_boolean(t)
                   else "fill it with a value of that type, or cast the column to bool first")
            raise self._spec_error(
                f"fill value {short_repr(v)} for column {short_repr(c)} is "
                f"{'true/false' if isinstance(v, bool) else 'not true/false'}; the column is "
                f"{printable(str(t), 200)}. {fix[0].upper()}{fix[1:]}"
            )
        try:
            # An int beyond int64, which Arrow's type inference cannot hold,
            # starts as uint64 (it fits a uint64 column).
            big = isinstance(v, int) and not isinstance(v, bool) and v > 2**63 - 1
            given = pa.scalar(v, pa.uint64()) if big else pa.scalar(v)
            out = given.cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError,
                OverflowError):
            raise self._spec_error(
                f"fill value {short_repr(v)} for column {short_repr(c)} cannot be cast to the "
                f"column type {printable(str(t), 200)}"
            ) from None
        if pa.types.is_floating(t) and _overflow_rows(pa.array([given]), pa.array([out]), False)[0]:
            raise self._spec_error(
                f"fill value {short_repr(v)} for column {short_repr(c)} overflows the column type "
                f"{printable(str(t), 200)} (it would become infinite); use a value within its range"
            )
        return out

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        for c in self.values:
            self._fill_value(c, self._require(schema, c, arg="values"))
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        for c in self.values:
            i = table.column_names.index(c)
            col = table.column(i)
            table = table.set_column(i, table.schema.field(i), col.fill_null(self._fill_value(c, col.type)))
        return table

