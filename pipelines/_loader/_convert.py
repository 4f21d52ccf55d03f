"""Arrow -> NumPy column conversion with the loader's dtype rules (no jax import).

Every conversion is a view of Arrow's buffers where Arrow allows one:

===============================  =========================================
Arrow column                     NumPy result (copies made here)
===============================  =========================================
numeric scalar (int/float)       ``(n,)`` view of the values buffer (0)
``bool``                         ``(n,)`` bool (1: Arrow packs bits)
``fixed_size_list`` (nested)     ``(n, d1, d2, ...)`` view of the leaf
                                 values buffer (0)
Ray tensor extension             ``(n, *shape)`` view of the values (0)
pyarrow ``fixed_shape_tensor``   ``(n, *shape)`` view of the values (0)
``list`` / ``large_list``        ``(n, L)`` padded/truncated to a declared
                                 length ``L`` (1, vectorised gather)
string / binary / struct / ...   refused (:class:`SpecError`)
===============================  =========================================

Dtype rules (decided from the schema, before any read):

- JAX without ``jax_enable_x64`` keeps 32 bits: an ``int64`` / ``uint64`` /
  ``float64`` column is refused unless ``dtypes`` names a 32-bit (or smaller)
  type for it or x64 is enabled; a ``dtypes`` target of 64 bits needs x64 too.
- A ``dtypes`` cast is range-checked on the host: an integer outside the
  target's range, a non-finite float cast to an integer, or a finite float
  beyond the target float's range is a :class:`SpecError` naming the column,
  the row and the value. Rounding to a narrower float within range is allowed
  (round to nearest even, as ``jnp.asarray(x, dtype)``); a float cast to an
  integer truncates toward zero.
- A field that follows the bfloat16 storage convention (``uint16`` bits with
  ``slicefeed.dtype: bfloat16`` metadata) is delivered as bfloat16 through a
  zero-copy ``.view()`` of its bits.
- ``pad_values`` applies to every column kind (padding of a partial batch,
  and within-row padding of variable-length lists); it must fit the output dtype.

A null in a batch (a null row, or a null element inside one of its lists or
tensors) is a :class:`SpecError` naming the column; only the batch's own rows
are checked.

A column made of several chunks (a batch spanning Ray blocks) is concatenated
once (1 copy); a host-side ``dtypes`` cast is one more copy (``astype``);
padding a partial final batch copies that batch once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from slicefeed.connectors import MissingColumnError, SpecError, _compat
from slicefeed.connectors._errors import printable, short_repr
from slicefeed.transforms import is_bfloat16_field
from slicefeed.transforms._arrays import leaf_type, storage_type

MASK_KEY = "mask"


def resolve_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype for ``dtype`` (NumPy/JAX dtypes, or names like ``"bfloat16"``)."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError:
        # jax.numpy scalar types (jnp.bfloat16, jnp.int32) expose .dtype
        return np.dtype(getattr(dtype, "dtype", dtype))


def _output_dtype(c: str, dtype: Any) -> np.dtype:
    """``dtypes[c]`` as a NumPy dtype a JAX array can hold and a range check can
    guard: bool, (u)int8-64, float16/32/64 or bfloat16; else SpecError. A
    non-native byte order (``">i4"``) names the same values, and JAX holds
    native order only: it is delivered in native order."""
    if dtype is None:
        # np.dtype(None) is float64: a None here is a mistake, not a choice.
        raise SpecError(
            f"JaxLoader: dtypes[{short_repr(c)}] = None is not a dtype; leave {short_repr(c)} "
            f"out of dtypes= to keep its own type, or name one (bool, int8-int64, "
            f"uint8-uint64, float16/32/64 or bfloat16).")
    try:
        dt = resolve_dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is not None and not dt.isnative:
        dt = dt.newbyteorder("=")
    if dt is None or not (dt == _bfloat16() or (dt.kind in "biuf" and dt.itemsize <= 8)):
        raise SpecError(
            f"JaxLoader: dtypes[{c!r}] = {str(dtype)[:40]!r} is not an output dtype the "
            f"loader delivers; use bool, int8-int64, uint8-uint64, float16/32/64 or bfloat16.")
    return dt


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == _bfloat16()


def _float_max(dt: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dt).max)


def _tensor_shape(t: pa.DataType) -> tuple[int, ...] | None:
    """The per-row shape of a fixed-shape tensor extension type, else None."""
    if isinstance(t, pa.FixedShapeTensorType):
        return tuple(t.shape)
    shape = getattr(t, "shape", None)
    if (isinstance(t, pa.BaseExtensionType) and isinstance(shape, tuple)
            and all(isinstance(d, int) and d >= 0 for d in shape)):
        return shape
    return None


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_wide(dt: np.dtype) -> bool:
    return dt.kind in "iuf" and dt.itemsize == 8


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """How one Arrow column becomes one NumPy array (decided from the schema).

    ``arrow_dtype`` is the dtype of the Arrow values as NumPy reads them;
    ``view_dtype`` (bfloat16 storage convention) reinterprets those bits;
    ``out_dtype`` is what the loader delivers (a range-checked cast when it differs).
    """

    name: str
    kind: str  # "scalar" | "fixed" | "tensor" | "varlen"
    row_shape: tuple[int, ...]
    arrow_dtype: np.dtype
    out_dtype: np.dtype
    pad_length: int | None = None
    pad_value: Any = 0
    view_dtype: np.dtype | None = None
    #: The Arrow type the conversion was planned for; every batch's column is
    #: checked against it (:func:`convert_table`).
    source_type: pa.DataType | None = None


def _listed(names: list[str], limit: int = 20) -> str:
    """Column names for a message: the first ``limit``, each cut and escaped."""
    shown = ", ".join(printable(n, 60) for n in names[:limit])
    more = f", ... ({len(names)} columns)" if len(names) > limit else ""
    return (shown + more) or "(none)"


def _x64_error(c: str, what: str) -> SpecError:
    return SpecError(
        f"JaxLoader: column {c!r} {what}, but JAX has jax_enable_x64 off and would "
        f"silently make it 32-bit (integers wrap). Either pass dtypes={{{c!r}: 'int32'}} "
        f"(or 'float32', ...: a host-side cast that fails on out-of-range values) or "
        f"enable x64 (jax.config.update('jax_enable_x64', True)) before creating the loader."
    )


def _pad_value(c: str, value: Any, dt: np.dtype) -> Any:
    """``value`` if the output dtype ``dt`` holds it (floats may round), else SpecError."""
    try:
        x = float(value)
        if dt == np.bool_:
            ok = x in (0.0, 1.0)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            ok = x == int(x) and info.min <= int(value) <= info.max
        else:
            ok = not np.isfinite(x) or abs(x) <= _float_max(dt)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise SpecError(
            f"JaxLoader: pad_values[{c!r}] = {short_repr(value)} does not fit the column's output "
            f"dtype {dt}; pass a value in that dtype's range."
        )
    return value


def plan_columns(
    schema: pa.Schema,
    *,
    columns: list[str] | None = None,
    exclude: list[str] | tuple[str, ...] = (),
    dtypes: Mapping[str, Any] | None = None,
    pad_lengths: Mapping[str, int] | None = None,
    pad_values: Mapping[str, Any] | None = None,
    reserved: tuple[str, ...] = (),
    x64: bool = False,
) -> list[ColumnSpec]:
    """Validates the requested columns against ``schema`` and decides each conversion.

    Raises:
        SpecError: Unknown column in ``columns``/``exclude``/``dtypes``/``pad_lengths``/
            ``pad_values``, a string/binary column that is not excluded, a
            variable-length list column without a ``pad_lengths`` entry, an
            unsupported type, a 64-bit column or target with ``x64`` off, or a
            pad value the output dtype cannot hold.
    """
    names = list(schema.names)
    available = _listed(names)
    dtypes = dict(dtypes or {})
    pad_lengths = dict(pad_lengths or {})
    pad_values = dict(pad_values or {})
    for arg, requested in (
        ("columns", columns or []),
        ("exclude", exclude),
        ("dtypes", dtypes),
        ("pad_lengths", pad_lengths),
        ("pad_values", pad_values),
    ):
        for c in requested:
            if c not in names:
                raise MissingColumnError(
                    f"JaxLoader: column {short_repr(c)} given in {arg}= not found in the dataset; "
                    f"available: {available}."
                )
    selected = [c for c in (columns if columns is not None else names) if c not in set(exclude)]
    if not selected:
        raise SpecError(f"JaxLoader: no columns selected; available: {available}.")
    for c in selected:
        if names.count(c) > 1:
            raise SpecError(
                f"JaxLoader: column {short_repr(c)} appears {names.count(c)} times in the "
                f"dataset's schema, so the loader cannot tell which one to deliver; rename "
                f"the duplicates in the pipeline, or leave it out with exclude=[{short_repr(c)}].")
        if c in reserved:
            raise SpecError(
                f"JaxLoader: column {c!r} clashes with the loader's {c!r} output "
                f"(remainder='pad' adds it); rename the column or pass mask_key=."
            )
    specs = []
    for c in selected:
        field = schema.field(c)
        t = field.type
        ext = _compat.unregistered_ray_extension(field)
        if ext is not None:
            # Its storage type has lost the per-row shape: never guess it.
            raise SpecError(
                f"JaxLoader: column {c!r} was written as Ray Data's {ext} type, which "
                f"this process could not register (importing ray.data failed), so only "
                f"its storage {t} is known; make ray.data importable, or exclude it."
            )
        storage = storage_type(t)
        leaf = leaf_type(t)
        if (
            pa.types.is_string(leaf)
            or pa.types.is_large_string(leaf)
            or pa.types.is_binary(leaf)
            or pa.types.is_large_binary(leaf)
            or getattr(pa.types, "is_string_view", lambda _: False)(leaf)
        ):
            raise SpecError(
                f"JaxLoader: column {c!r} is a string/binary column ({t}); only numeric "
                f"columns can become jax.Arrays. Tokenize or encode it in the pipeline, or "
                f"leave it out with exclude=[{c!r}] (or columns=[...])."
            )
        if not _is_numeric(leaf):
            raise SpecError(
                f"JaxLoader: column {c!r} has type {t}, which the loader cannot turn into "
                f"a dense array (numeric scalars, fixed_size_list, tensor columns and "
                f"padded lists are supported); exclude it or convert it first."
            )
        arrow_dtype = np.dtype(leaf.to_pandas_dtype())
        view = None
        if is_bfloat16_field(field):
            if arrow_dtype != np.uint16:
                raise SpecError(
                    f"JaxLoader: column {c!r} says it holds bfloat16 bits "
                    f"(slicefeed.dtype metadata) but its values are {leaf}, not uint16; "
                    f"rewrite it with slicefeed.transforms' bfloat16 helpers."
                )
            view = _bfloat16()
        native = view if view is not None else arrow_dtype
        if c in dtypes:
            out_dtype = _output_dtype(c, dtypes[c])
            if not x64 and _is_wide(out_dtype):
                raise _x64_error(c, f"is cast to {out_dtype} by dtypes=")
        else:
            out_dtype = native
            if not x64 and _is_wide(native):
                raise _x64_error(c, f"is {leaf}")
        pad_value = _pad_value(c, pad_values.get(c, 0), out_dtype)
        perm = getattr(t, "permutation", None)
        if isinstance(t, pa.FixedShapeTensorType) and perm and list(perm) != sorted(perm):
            # Its values are stored in another dimension order than its shape:
            # a reshape of the buffer would silently reorder every row.
            raise SpecError(
                f"JaxLoader: column {c!r} is a tensor stored with dimension permutation "
                f"{list(perm)} ({t}); only row-major tensors load as zero-copy views. "
                f"Rewrite it row-major (e.g. a fixed_shape_tensor without permutation) "
                f"in the pipeline, or exclude it."
            )
        tshape = _tensor_shape(t)
        if tshape is not None:
            specs.append(
                ColumnSpec(c, "tensor", tshape, arrow_dtype, out_dtype, None, pad_value, view)
            )
            continue
        if isinstance(t, pa.BaseExtensionType):
            raise SpecError(
                f"JaxLoader: column {c!r} is a variable-shaped tensor column ({t}); pad it "
                f"to a fixed shape in the pipeline or exclude it."
            )
        if pa.types.is_fixed_size_list(storage):
            shape = []
            tt = storage
            while pa.types.is_fixed_size_list(tt):
                shape.append(tt.list_size)
                tt = storage_type(tt.value_type)
            if not _is_numeric(tt):
                raise SpecError(
                    f"JaxLoader: column {c!r} ({t}) mixes fixed- and variable-length "
                    f"lists; make every level fixed-size in the pipeline."
                )
            specs.append(
                ColumnSpec(c, "fixed", tuple(shape), arrow_dtype, out_dtype, None, pad_value, view)
            )
            continue
        if pa.types.is_list(storage) or pa.types.is_large_list(storage):
            if not _is_numeric(storage_type(storage.value_type)):
                raise SpecError(
                    f"JaxLoader: column {c!r} ({t}) is a nested variable-length list; only "
                    f"one level of list<number> can be padded. Flatten or pad it first."
                )
            if c not in pad_lengths:
                raise SpecError(
                    f"JaxLoader: column {c!r} is a variable-length list ({t}); static "
                    f"shapes need a padding length: pass pad_lengths={{{c!r}: L}} (rows are "
                    f"padded with pad_values.get({c!r}, 0) or truncated to L), or exclude it."
                )
            L = int(pad_lengths[c])
            if L <= 0:
                raise SpecError(f"JaxLoader: pad_lengths[{c!r}] must be positive, got {L}.")
            specs.append(
                ColumnSpec(c, "varlen", (L,), arrow_dtype, out_dtype, L, pad_value, view)
            )
            continue
        specs.append(ColumnSpec(c, "scalar", (), arrow_dtype, out_dtype, None, pad_value, view))
    specs = [dataclasses.replace(s, source_type=schema.field(s.name).type) for s in specs]
    for c in pad_lengths:
        if c in selected and not any(s.name == c and s.kind == "varlen" for s in specs):
            raise SpecError(
                f"JaxLoader: pad_lengths[{c!r}] given but column {c!r} is not a "
                f"variable-length list ({schema.field(c).type}); remove the entry."
            )
    return specs


# Describes row i of the batch being converted ("file part-0.parquet row 17"), for errors.
Locator = Callable[[int], str]


def _default_locator(i: int) -> str:
    return f"row {i} of the batch"


def _copied(counter: list[int], nbytes: int) -> None:
    """Counts one copy of a column (``counter[1]``, when present, adds its bytes)."""
    counter[0] += 1
    if len(counter) > 1:
        counter[1] += int(nbytes)


def _single_chunk(col: pa.ChunkedArray | pa.Array, counter: list[int]) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        out = col.combine_chunks()
        _copied(counter, out.nbytes)
        return out
    return col


def _values_of(arr: pa.Array) -> pa.Array:
    """The child values of the rows of a ``fixed_size_list`` array (honouring its
    slice offset): a zero-copy slice, without a compute-kernel dispatch
    (``flatten()`` dispatches one per call, a fixed cost per batch). Ray's
    tensor extension stores its rows as a variable-length list: ``flatten()``,
    which honours the slice's offsets."""
    if not pa.types.is_fixed_size_list(arr.type):
        return arr.flatten()
    size = arr.type.list_size
    return arr.values.slice(arr.offset * size, len(arr) * size)


def _check_nulls(name: str, arr: pa.Array, locate: Locator = _default_locator,
                 row_of: Callable[[int], int] = int) -> None:
    """SpecError naming the row of ``arr``'s first null (``row_of`` maps an element
    of a nested level to its row): a JAX array has no nulls."""
    if arr.null_count:
        import pyarrow.compute as pc

        row = row_of(pc.index(arr.is_null(), True).as_py())
        raise SpecError(
            f"JaxLoader: column {name!r}, {locate(row)}: a null value ({arr.null_count} "
            f"in this batch), which a JAX array cannot hold; fill them in the pipeline (e.g. "
            f"a fill_null transform; pandas' NaN arrives in Arrow as a null) or exclude the "
            f"column."
        )


def _row_of(level: pa.Array, rows: int) -> Callable[[int], int]:
    """Row of element ``i`` of a nested level holding the same number of elements
    for each of the batch's ``rows`` rows."""
    per = max(len(level) // max(rows, 1), 1)
    return lambda i: i // per


def _primitive_view(arr: pa.Array, counter: list[int]) -> np.ndarray:
    if pa.types.is_boolean(arr.type):
        out = arr.to_numpy(zero_copy_only=False)
        _copied(counter, out.nbytes)
        return out
    return arr.to_numpy(zero_copy_only=True)


def _bound_in(bound: int, dt: np.dtype) -> bool:
    info = np.iinfo(dt)
    return info.min <= bound <= info.max


def _out_of_range(a: np.ndarray, to: np.dtype) -> np.ndarray | None:
    """Flat indices of ``a`` whose cast to ``to`` is not allowed (see the module
    docstring), or None when the cast cannot go out of range. ``a`` is flat."""
    src = a.dtype
    if src == np.bool_ or np.can_cast(src, to, "safe"):
        return None
    if to == np.bool_:  # only 0 and 1 are booleans (NaN is neither)
        return ~((a == 0) | (a == 1))
    if to.kind in "iu":
        info = np.iinfo(to)
        if src.kind in "iu":
            # One min and one max for the common in-range batch; the mask only
            # when some value is out of range.
            if not a.size or info.min <= int(a.min()) and int(a.max()) <= info.max:
                return None
            bad = np.zeros(a.shape, dtype=bool)
            if _bound_in(info.min, src) and int(a.min(initial=0)) < info.min:
                bad |= a < np.asarray(info.min, dtype=src)
            if _bound_in(info.max, src) and int(a.max(initial=0)) > info.max:
                bad |= a > np.asarray(info.max, dtype=src)
            return bad
        # float -> int: finite and inside [min, max] after truncation toward zero.
        # The upper bound is max + 1, a power of two a float holds exactly
        # (float(2**63 - 1) is 2**63, which would pass "t > max" and wrap).
        t = np.trunc(a.astype(np.float64))
        return ~np.isfinite(t) | (t < info.min) | (t >= float(int(info.max) + 1))
    if _is_float(to) and (src.kind in "iu" or _is_float(src)):
        limit = _float_max(to)
        x = a.astype(np.float64)
        return np.isfinite(x) & (np.abs(x) > limit)
    return None


def _checked_cast(spec: ColumnSpec, a: np.ndarray, locate: Locator, counter: list[int]):
    to = spec.out_dtype
    flat = a.reshape(-1)
    bad = _out_of_range(flat, to)
    if bad is not None and bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = i // max(int(np.prod(spec.row_shape, dtype=np.int64)), 1)
        value = repr(flat[i].item() if flat.dtype != _bfloat16() else float(flat[i]))[:40]
        raise SpecError(
            f"JaxLoader: column {spec.name!r}, {locate(row)}: value {value} does not fit "
            f"dtypes[{spec.name!r}] = {to} (cast from {a.dtype}); use a wider dtype "
            f"(with x64 enabled for 64-bit) or fix the value in the pipeline."
        )
    out = a.astype(to)
    _copied(counter, out.nbytes)
    return out


def convert_column(
    spec: ColumnSpec,
    col: pa.ChunkedArray | pa.Array,
    counter: list[int],
    locate: Locator = _default_locator,
):
    """One column of a batch as a NumPy array of ``spec.out_dtype``.

    ``counter[0]`` is incremented once per full copy of the column made here
    (``counter[1]``, when present, adds the bytes copied);
    ``locate(i)`` names row ``i`` of the batch in a range error.
    """
    arr = _single_chunk(col, counter)
    n = len(arr)
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    _check_nulls(spec.name, arr, locate)
    if spec.kind == "scalar":
        out = _primitive_view(arr, counter)
    elif spec.kind == "fixed":
        a = arr
        while pa.types.is_fixed_size_list(a.type):
            a = _values_of(a)
            if isinstance(a, pa.ExtensionArray):
                a = a.storage
            _check_nulls(spec.name, a, locate, _row_of(a, n))
        out = _primitive_view(a, counter).reshape((n,) + spec.row_shape)
    elif spec.kind == "tensor":
        a = _values_of(arr)
        if isinstance(a, pa.ExtensionArray):
            a = a.storage
        while pa.types.is_fixed_size_list(a.type):
            _check_nulls(spec.name, a, locate, _row_of(a, n))
            a = _values_of(a)
        # A null element has no value (bool: not False).
        _check_nulls(spec.name, a, locate, _row_of(a, n))
        out = _primitive_view(a, counter).reshape((n,) + spec.row_shape)
    elif spec.kind == "varlen":
        L = spec.pad_length
        offsets = arr.offsets.to_numpy(zero_copy_only=False)  # n+1 ints, small
        # Only this batch's values: a slice's child holds the whole block's.
        lo = int(offsets[0]) if n else 0
        values = arr.values.slice(lo, int(offsets[-1]) - lo if n else 0)
        offsets = offsets - lo
        if isinstance(values, pa.ExtensionArray):
            values = values.storage
        _check_nulls(spec.name, values, locate,
                     lambda i: int(np.searchsorted(offsets, i, side="right")) - 1)
        vals = _primitive_view(values, counter)
        if spec.view_dtype is not None:
            vals = vals.view(spec.view_dtype)
        lengths = np.minimum(np.diff(offsets), L)
        valid = np.arange(L)[None, :] < lengths[:, None]
        out = np.zeros((n, L), dtype=vals.dtype)
        pos = offsets[:-1, None] + np.arange(L)[None, :]
        out[valid] = vals[pos[valid]]
        _copied(counter, out.nbytes)
        if out.dtype != spec.out_dtype:  # the zeros of the padding are always in range
            out = _checked_cast(spec, out, locate, counter)
        if spec.pad_value != 0:
            out[~valid] = spec.pad_value
        return out
    else:  # pragma: no cover
        raise AssertionError(spec.kind)
    if spec.view_dtype is not None and out.dtype != spec.view_dtype:
        out = out.view(spec.view_dtype)  # same bits, no copy
    if out.dtype != spec.out_dtype:
        out = _checked_cast(spec, out, locate, counter)
    return out


def convert_table(
    specs: list[ColumnSpec],
    table: pa.Table,
    counter: list[int] | None = None,
    locate: Locator = _default_locator,
) -> dict[str, np.ndarray]:
    """Converts the selected columns of ``table`` (see :func:`plan_columns`)."""
    counter = counter if counter is not None else [0]
    check_table(specs, table, locate)
    return {s.name: convert_column(s, table.column(s.name), counter, locate) for s in specs}


def check_table(specs: list[ColumnSpec], table: pa.Table,
                locate: Locator = _default_locator) -> None:
    """Every selected column of ``table`` is there, with the type (and the
    bfloat16 marker) its conversion was planned for, or one of the same
    layout; else SpecError / MissingColumnError (see :func:`_check_type`)."""
    for s in specs:
        _check_type(s, table.schema, locate)


#: Verdicts of :func:`_same_layout` by (spec, Arrow type of a batch's column).
_LAYOUTS: dict[tuple, bool] = {}


def _check_type(spec: ColumnSpec, schema: pa.Schema, locate: Locator) -> None:
    """A batch's column has the type the conversion was planned for, or one that
    converts to the same array layout (a tensor extension and its
    ``fixed_size_list`` storage, ``list`` and ``large_list``); otherwise
    SpecError. Ray Data's blocks of one dataset need not share a schema, and a
    conversion planned for another type would change values (a float block cast
    to a planned integer type, float64 to float32)."""
    i = schema.get_field_index(spec.name)
    if i < 0:
        raise MissingColumnError(
            f"JaxLoader: column {spec.name!r} is missing from the batch at {locate(0)} "
            f"(it is in the schema the loader planned from): the source's blocks differ "
            f"in columns. Give every block the same columns in the pipeline (select / "
            f"fill_null), or leave the column out with exclude=[{spec.name!r}].")
    field = schema.field(i)
    if is_bfloat16_field(field) != (spec.view_dtype is not None):
        # The same uint16 bits are bfloat16 numbers in one block and integers in
        # another: either reading would change the other's every value.
        marked, plain = "bfloat16 bits (slicefeed.dtype metadata)", f"plain {field.type}"
        this, planned = (marked, plain) if spec.view_dtype is None else (plain, marked)
        raise SpecError(
            f"JaxLoader: column {spec.name!r} holds {this} in the batch at {locate(0)}, but "
            f"{planned} in the schema the loader planned from: the source's blocks differ, "
            f"and reading one as the other would change every value. Write the column the "
            f"same way everywhere (slicefeed.transforms' bfloat16 helpers), or exclude it.")
    t = field.type
    if spec.source_type is None or t == spec.source_type:
        return
    key = (spec.name, spec.source_type, t, spec.kind, spec.row_shape, spec.arrow_dtype,
           spec.out_dtype, spec.pad_length)
    same = _LAYOUTS.get(key)
    if same is None:
        same = _LAYOUTS[key] = _same_layout(spec, field)
    if not same:
        raise SpecError(
            f"JaxLoader: column {spec.name!r} is {t} in the batch at {locate(0)}, but "
            f"{spec.source_type} in the schema the loader planned from: the source's "
            f"blocks differ in type, and converting one to the other could change values. "
            f"Cast the column to one type in the pipeline (e.g. a cast transform).")


def _same_layout(spec: ColumnSpec, field: pa.Field) -> bool:
    """Whether ``field`` converts to the array ``spec`` describes (same row shape and
    value dtype; a tensor and a fixed-size list of that shape are alike)."""
    dense = {"tensor": "fixed", "fixed": "fixed"}
    try:
        (other,) = plan_columns(
            pa.schema([field]), dtypes={field.name: spec.out_dtype},
            pad_lengths={field.name: spec.pad_length} if spec.kind == "varlen" else None,
            x64=True)
    except SpecError:
        return False
    return ((dense.get(other.kind, other.kind), other.row_shape, other.arrow_dtype)
            == (dense.get(spec.kind, spec.kind), spec.row_shape, spec.arrow_dtype))


def empty_batch(specs: list[ColumnSpec], rows: int) -> dict[str, np.ndarray]:
    """A batch of ``rows`` rows filled with each column's pad value."""
    return {
        s.name: np.full((rows,) + s.row_shape, s.pad_value, dtype=s.out_dtype) for s in specs
    }


def pad_batch(
    batch: dict[str, np.ndarray], specs: list[ColumnSpec], rows: int
) -> dict[str, np.ndarray]:
    """Pads every array of ``batch`` to ``rows`` rows with the column's pad value."""
    out = {}
    for s in specs:
        a = batch[s.name]
        if len(a) == rows:
            out[s.name] = a
            continue
        p = np.full((rows,) + a.shape[1:], s.pad_value, dtype=a.dtype)
        p[: len(a)] = a
        out[s.name] = p
    return out


def row_bytes(specs: list[ColumnSpec]) -> int:
    """Bytes of one delivered row (all selected columns)."""
    return sum(int(np.prod(s.row_shape, dtype=np.int64)) * s.out_dtype.itemsize for s in specs)
