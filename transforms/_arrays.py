"""Zero-copy access to Arrow list and tensor arrays as NumPy (values, offsets).

Fixed-shape outputs are written as Arrow's canonical ``arrow.fixed_shape_tensor``
extension type (:func:`tensor_type`, :func:`make_tensor`): its storage is one
``fixed_size_list<T>[prod(shape)]``, Parquet keeps the type, and Ray Data,
NumPy-batch consumers and ``iter_jax_batches`` read it as a dense
``(rows, *shape)`` array. Plain ``fixed_size_list`` columns (the layout written
before) are read the same way everywhere: :func:`list_parts` and
:func:`list_like` treat a tensor row as a list of its ``prod(shape)`` values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: Longest fixed row length a transform writes (``pad_or_truncate`` length,
#: ``pack_sequences`` seq_len): every output row is allocated at this length.
MAX_ROW_LENGTH = 1 << 20


def list_parts(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, offsets, valid)`` of a list / binary / string array.

    ``offsets`` are rebased to start at 0 (length n + 1, int64); ``values`` is
    the matching slice of the child values (a NumPy view where Arrow allows:
    uint8 for binary/string). Null rows have an empty range.

    A null value inside a valid list reads as 0 (False for booleans) and keeps
    the values' dtype (NumPy would make int64 values float64, NaN for the null,
    changing the other values beyond 2**53). A caller that writes the values
    marks those rows bad: :func:`null_value_rows`.
    """
    arr = tensor_storage(arr)
    t = arr.type
    n = len(arr)
    valid = (
        np.ones(n, dtype=bool)
        if arr.null_count == 0
        else arr.is_valid().to_numpy(zero_copy_only=False)
    )
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        flat = arr.flatten() if arr.null_count == 0 else _fsl_values(arr)
        offsets = np.arange(n + 1, dtype=np.int64) * size
        values = _numpy_values(flat)
        if arr.null_count:
            # Null rows of a fixed-size list are empty here, like other lists.
            lengths = np.where(valid, size, 0)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            values = values.reshape(n, size)[valid].reshape(-1) if size else values
        return values, offsets, valid
    if pa.types.is_binary(t) or pa.types.is_string(t):
        odt, bufs = np.int32, arr.buffers()
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        odt, bufs = np.int64, arr.buffers()
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = arr.offsets.to_numpy().astype(np.int64)
        start, end = offsets[0], offsets[-1]
        values = _numpy_values(arr.values.slice(start, end - start))
        offsets = offsets - start
        if arr.null_count:
            lengths = np.where(valid, np.diff(offsets), 0)
            if (lengths != np.diff(offsets)).any():
                keep = np.repeat(valid, np.diff(offsets))
                values = values[keep]
            offsets = np.concatenate([[0], np.cumsum(lengths)])
        return values, offsets, valid
    else:
        raise TypeError(f"not a list/binary/string array: {t}")
    # binary / string: buffers = [validity, offsets, data]
    raw_off = np.frombuffer(bufs[1], dtype=odt)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    start, end = (raw_off[0], raw_off[-1]) if n else (0, 0)
    values = data[start:end]
    offsets = raw_off - start
    if arr.null_count:
        lengths = np.where(valid, np.diff(offsets), 0)
        if (lengths != np.diff(offsets)).any():
            values = values[np.repeat(valid, np.diff(offsets))]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
    return values, offsets, valid


def _numpy_values(values: pa.Array) -> np.ndarray:
    """A list's child values as NumPy, a null number or boolean read as 0 / False
    in the values' own dtype (see :func:`list_parts`)."""
    t = values.type
    if values.null_count and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        values = values.fill_null(pa.scalar(False if pa.types.is_boolean(t) else 0).cast(t))
    return values.to_numpy(zero_copy_only=False)


def leaf_rows(arr: pa.Array | pa.ChunkedArray, *, rows: bool = True
              ) -> tuple[pa.Array, np.ndarray | None]:
    """``(leaves, row)``: the values of a (nested) list or tensor column's valid
    rows, flattened in row order, and the row of ``arr`` each one belongs to.

    Honours the slice offset; values a null row's slots or offsets still cover
    belong to no row and are left out. A column that is no list is its own
    leaves (``row`` is ``arange``). With ``rows=False`` the same leaves come
    without their rows (``row`` is None): no row map is built, for a check
    that needs row numbers only once it finds something.
    """
    arr = tensor_storage(arr)
    row = np.arange(len(arr), dtype=np.int64) if rows else None
    while list_like(arr.type):
        arr = tensor_storage(arr)
        if row is None:
            arr = arr.flatten()  # the valid rows' values, within the slice
            continue
        n = len(arr)
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
            child = _fsl_values(arr)
            lengths = np.full(n, size, dtype=np.int64)
        else:
            offsets = arr.offsets.to_numpy().astype(np.int64)
            child = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
            lengths = np.diff(offsets)
        parent = np.repeat(np.arange(n, dtype=np.int64), lengths)
        if arr.null_count:
            keep = np.repeat(arr.is_valid().to_numpy(zero_copy_only=False), lengths)
            child, parent = child.filter(pa.array(keep)), parent[keep]
        arr, row = child, row[parent]
    return arr, row


def rows_of(leaf_mask: np.ndarray, row: np.ndarray, n: int) -> np.ndarray:
    """Boolean mask of the ``n`` rows holding a leaf where ``leaf_mask`` (see :func:`leaf_rows`)."""
    bad = np.zeros(n, dtype=bool)
    bad[row[np.asarray(leaf_mask, dtype=bool)]] = True
    return bad


def null_value_rows(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Boolean mask of the valid rows of a list or tensor column that hold a
    null value (a null row itself is not one of them)."""
    child = tensor_storage(arr)
    while list_like(child.type):
        child = tensor_storage(child.values)
    if not child.null_count:  # every child value, also under null rows: none is null
        return np.zeros(len(arr), dtype=bool)
    leaves, row = leaf_rows(arr)
    if not leaves.null_count:
        return np.zeros(len(arr), dtype=bool)
    return rows_of(leaves.is_null().to_numpy(zero_copy_only=False), row, len(arr))


def is_tensor(t: pa.DataType) -> bool:
    """Whether ``t`` is Arrow's canonical ``fixed_shape_tensor`` extension type,
    stored row-major (a tensor with a dimension permutation is not: reading its
    storage as row-major would reorder every row, so it is no tensor here)."""
    if not isinstance(t, pa.FixedShapeTensorType):
        return False
    perm = t.permutation
    return not perm or list(perm) == sorted(perm)


def tensor_type(value_type: pa.DataType, shape: tuple[int, ...] | list[int]) -> pa.DataType:
    """``arrow.fixed_shape_tensor`` of ``value_type`` with per-row ``shape`` (row-major)."""
    return pa.fixed_shape_tensor(value_type, tuple(int(d) for d in shape))


def tensor_storage(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``arr`` as one chunk; a tensor column as its ``fixed_size_list`` storage (no copy)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if is_tensor(arr.type):
        arr = arr.storage
    return arr


def fixed_shape(t: pa.DataType) -> tuple[int, ...] | None:
    """The per-row shape of a tensor type or a (nested) ``fixed_size_list`` of
    scalars, else None."""
    if is_tensor(t):
        return tuple(t.shape)
    shape = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if not shape or pa.types.is_nested(t) or isinstance(t, pa.BaseExtensionType):
        return None
    return tuple(shape)


def fixed_values(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The leaf values of a tensor or (nested) ``fixed_size_list`` column, row-major,
    honouring the slice offset (null rows keep their slots)."""
    arr = tensor_storage(arr)
    while pa.types.is_fixed_size_list(arr.type):
        arr = _fsl_values(arr)
    return arr


def _fsl_values(arr: pa.FixedSizeListArray) -> pa.Array:
    # .values ignores the parent's slice offset; take the slice explicitly.
    size = arr.type.list_size
    return arr.values.slice(arr.offset * size, len(arr) * size)


def rebuild_like(col: pa.Array, flat: pa.Array) -> pa.Array:
    """The fixed-size list or tensor column ``col``'s shape and nulls around new
    row-major leaf values ``flat`` (any value type)."""
    storage = tensor_storage(col)
    mask = storage.is_null() if storage.null_count else None
    fsl = pa.FixedSizeListArray.from_arrays(flat, storage.type.list_size, mask=mask)
    if is_tensor(col.type):
        return pa.ExtensionArray.from_storage(with_value_type(col.type, flat.type), fsl)
    return fsl


_INT32 = pa.int32()


def make_list(
    values: np.ndarray,
    offsets: np.ndarray,
    valid: np.ndarray | None = None,
    value_type: pa.DataType = _INT32,
) -> pa.ListArray:
    """A ``list<value_type>`` array from NumPy parts (nulls where not ``valid``)."""
    mask = None if valid is None or valid.all() else pa.array(~valid)
    offs = pa.array(offsets.astype(np.int32 if offsets[-1] < 2**31 else np.int64))
    vals = pa.array(values, type=value_type)
    if offs.type == pa.int64():
        return pa.LargeListArray.from_arrays(offs, vals, mask=mask)
    return pa.ListArray.from_arrays(offs, vals, mask=mask)


def make_fixed(
    values: np.ndarray,
    size: int,
    valid: np.ndarray | None = None,
    value_type: pa.DataType = _INT32,
) -> pa.FixedSizeListArray:
    """A ``fixed_size_list<value_type>[size]`` array from a dense (n * size) array."""
    mask = None if valid is None or valid.all() else pa.array(~valid)
    return pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(values).reshape(-1), type=value_type), size, mask=mask
    )


def make_tensor(
    values: np.ndarray,
    shape: tuple[int, ...],
    valid: np.ndarray | None = None,
    value_type: pa.DataType = _INT32,
) -> pa.ExtensionArray:
    """An ``arrow.fixed_shape_tensor`` column from a dense ``(n, *shape)`` array
    (or its flat values); null rows where not ``valid``."""
    size = int(np.prod(shape, dtype=np.int64))
    storage = make_fixed(values, size, valid, value_type)
    return pa.ExtensionArray.from_storage(tensor_type(value_type, shape), storage)


def segment_arange(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(l) for l in lengths)`` without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def failing_rows(arr: pa.Array, fn) -> np.ndarray:
    """Rows of ``arr`` on which ``fn`` raises, by bisection (error path only).

    ``fn`` is applied to halves recursively, so k bad rows out of n cost
    O(k log n) calls instead of n.

    ``arr`` must not be a list or tensor column: Arrow's kernels on a slice of
    one (a cast) touch child values outside the slice (all of them for a
    fixed-size list), so a slice would fail for another row's value. Bisect
    the column's :func:`leaf_rows` instead and map the failing leaves to their
    rows (:func:`rows_of`).
    """
    if list_like(arr.type):
        raise TypeError(f"failing_rows needs a column without child values; got {arr.type}")
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


def storage_type(t: pa.DataType) -> pa.DataType:
    """``t``'s storage type for any extension type (a tensor, Ray's tensor types,
    JSON, opaque ...), else ``t``."""
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def leaf_type(t: pa.DataType) -> pa.DataType:
    """The value type at the bottom of a (nested) list, fixed-size list or tensor
    type; ``t`` itself for a scalar type.

    Every level is taken as its storage type, whatever the extension: values
    are what a cast converts (Arrow casts an extension array through its
    storage) and what the loader delivers. A cast's check that an infinity
    was an infinity before reads the storage of the values, so a column of a
    float or string extension type keeps its infinities like a plain one.
    """
    t = storage_type(t)
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = storage_type(t.value_type)
    return t


def list_like(t: pa.DataType) -> bool:
    """Whether ``t`` is a list, large list, fixed-size list or tensor type."""
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or is_tensor(t))


def with_value_type(t: pa.DataType, value_type: pa.DataType) -> pa.DataType:
    """The list or tensor type ``t`` (same kind and shape) with ``value_type`` elements."""
    if is_tensor(t):
        return tensor_type(value_type, t.shape)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(value_type, t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(value_type)
    return pa.list_(value_type)
