"""Type strings of specs and the bfloat16 storage convention.

Arrow has no bfloat16 type. slicefeed stores bfloat16 values as their ``uint16``
bit patterns, in a field whose metadata says ``slicefeed.dtype: bfloat16``
(Parquet keeps Arrow field metadata). A reader turns such a column back into
``ml_dtypes.bfloat16`` with a zero-copy ``.view()``: :func:`as_bfloat16`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from slicefeed.connectors import SpecError, short_repr

DTYPE_METADATA_KEY = b"slicefeed.dtype"
BFLOAT16 = "bfloat16"

_ALIASES = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "date32": pa.date32(),
    "timestamp[s]": pa.timestamp("s"),
    "timestamp[ms]": pa.timestamp("ms"),
    "timestamp[us]": pa.timestamp("us"),
    "timestamp[ns]": pa.timestamp("ns"),
}
TYPE_NAMES = (*_ALIASES, BFLOAT16)


def parse_type(name: str, *, label: str, arg: str) -> pa.DataType | str:
    """An Arrow type for ``name``, or the string ``"bfloat16"``.

    Raises:
        SpecError: listing the accepted type names.
    """
    if name == BFLOAT16:
        return BFLOAT16
    if isinstance(name, str) and name in _ALIASES:
        return _ALIASES[name]
    raise SpecError(
        f"{label}: unknown type {short_repr(name)} for {arg}; allowed: {', '.join(TYPE_NAMES)}"
    )


def bfloat16_field(name: str, type_: pa.DataType | None = None) -> pa.Field:
    """A field holding bfloat16 bit patterns (``uint16``, or a list of them)."""
    return pa.field(name, type_ or pa.uint16(), metadata={DTYPE_METADATA_KEY: BFLOAT16.encode()})


def is_bfloat16_field(field: pa.Field) -> bool:
    """Whether ``field`` follows the bfloat16 storage convention."""
    return bool(field.metadata) and field.metadata.get(DTYPE_METADATA_KEY) == BFLOAT16.encode()


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float array -> uint16 bit patterns of its bfloat16 rounding (nearest even)."""
    import ml_dtypes

    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def as_bfloat16(bits: np.ndarray) -> np.ndarray:
    """uint16 bit patterns -> an ``ml_dtypes.bfloat16`` view (no copy)."""
    import ml_dtypes

    return np.asarray(bits).view(ml_dtypes.bfloat16)


def type_label(field: pa.Field) -> str:
    """A field's type as ``slicefeed validate`` and ``inspect`` print it.

    A tensor column reads ``fixed_shape_tensor<int32>[2048]`` (value type,
    then the per-row shape), and a bfloat16 column names its convention:
    ``fixed_shape_tensor<uint16 (bfloat16 bits)>[224,224,3]``. Other types
    print as Arrow prints them.
    """
    t = field.type
    bf16 = is_bfloat16_field(field)
    if isinstance(t, pa.FixedShapeTensorType):
        value = f"{t.value_type} (bfloat16 bits)" if bf16 else str(t.value_type)
        return f"fixed_shape_tensor<{value}>[{','.join(str(d) for d in t.shape)}]"
    return f"{t} (bfloat16 bits)" if bf16 else str(t)


def as_float64(v, t: pa.DataType | None = None, *, integers_only: bool = False):
    """``v`` (an Arrow array, chunked array or compute expression, of type ``t``;
    default: ``v.type``) as float64.

    An integer beyond 2**53 rounds to the nearest float64 (53 significant
    bits, as Python's ``int / int`` does and any float result must); no
    integer overflows float64, so the unchecked cast only rounds, never wraps.
    Other numeric types cast checked. With ``integers_only`` only integers are
    cast: a filter's ``/`` divides floats in their own type and leaves any
    other type to Arrow's kernels (a string is refused there), while a scaler
    computes every numeric column in float64.
    """
    t = v.type if t is None else t
    if pa.types.is_integer(t):
        return v.cast(pa.float64(), safe=False)
    if integers_only or pa.types.is_float64(t):
        return v
    return v.cast(pa.float64())
