"""Seeded hashing: per-row randomness and stable value hashes, vectorised.

Everything random in slicefeed is a pure function of (seed, salt, row
identity) or of a value's bytes, never of global state, time or batch
boundaries, so reruns and re-executed Ray tasks give the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW, MissingColumnError
from slicefeed.transforms._arrays import list_parts, segment_arange

if typing.TYPE_CHECKING:  # pragma: no cover
    from slicefeed.transforms._contract import Transform

__all__ = ["GOLDEN", "hash64", "mix64", "row_keys", "row_uniform", "seeded_copy", "str_hash64"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: 2^64 / golden ratio: the splitmix64 increment, used to spread counters.
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised over uint64 (wraps on overflow)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        x = x ^ (x >> np.uint64(31))
    return x


def str_hash64(s: str | None) -> int:
    """A stable 64-bit hash of a string (BLAKE2b); 0 for None."""
    if s is None:
        return 0
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


def row_keys(table: pa.Table, *, seed: int, salt: str) -> np.ndarray:
    """One uint64 per row from (seed, salt, ``_sf_file``, ``_sf_row``).

    Vectorised: the file column is dictionary-encoded so only the distinct
    file names of a batch (usually one or two) are hashed in Python; the
    combination with the row index is NumPy.

    Raises:
        MissingColumnError: if ``table`` lacks the provenance columns.
    """
    missing = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c not in table.column_names]
    if missing:
        raise MissingColumnError(
            f"random transforms need the row identity columns {PROVENANCE_FILE!r} and "
            f"{PROVENANCE_ROW!r} (read with provenance=True); missing {missing}"
        )
    files = table.column(PROVENANCE_FILE)
    enc = pc.dictionary_encode(files).combine_chunks()
    file_hashes = np.array([str_hash64(s) for s in enc.dictionary.to_pylist()], np.uint64)
    idx = enc.indices.fill_null(-1).to_numpy().astype(np.int64)
    if len(file_hashes):
        fh = np.where(idx >= 0, file_hashes[np.clip(idx, 0, None)], np.uint64(0))
    else:
        fh = np.zeros(len(idx), np.uint64)
    rows = (
        table.column(PROVENANCE_ROW)
        .cast(pa.int64())
        .fill_null(-1)
        .to_numpy()
        .astype(np.int64)
        .view(np.uint64)
    )
    base = np.uint64(str_hash64(f"{seed}/{salt}"))
    with np.errstate(over="ignore"):
        k = mix64(base ^ fh.astype(np.uint64))
        k = mix64(k ^ (rows * GOLDEN))
    return k


def row_uniform(keys: np.ndarray, stream: int = 0) -> np.ndarray:
    """Uniform floats in [0, 1) from ``row_keys``; ``stream`` gives independent draws."""
    with np.errstate(over="ignore"):
        x = mix64(keys + np.uint64(stream + 1) * GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def seeded_copy(t: Transform, seed: int) -> Transform:
    """``with_seed`` for transforms with a ``seed: int | None`` field."""
    if getattr(t, "seed", None) is not None:
        return t
    return dataclasses.replace(t, seed=int(seed))


_P = np.uint64(0x100000001B3)


def hash64(arr: pa.Array | pa.ChunkedArray, *, salt: str = "") -> np.ndarray:
    """A stable 64-bit hash per value (uint64), vectorised; nulls hash to 0.

    Strings/binary: a polynomial hash over the bytes (one ``np.add.reduceat``
    over the values buffer) finalised with splitmix64; integers, floats,
    booleans, dates, times, timestamps and durations: splitmix64 of the
    value as a 64-bit integer (its storage integer for temporal types; a
    uint64 by its bit pattern). Stable across processes and runs (never
    Python's ``hash``), and independent of chunking and slicing. Interval
    types are not hashable (see ``is_hashable``).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    base = np.uint64(str_hash64("hash64/" + salt))
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
                pos = segment_arange(lengths)
                from_end = np.repeat(lengths, lengths) - 1 - pos
                terms = (values.astype(np.uint64) + np.uint64(1)) * powers[from_end]
                nz = lengths > 0
                sums = np.add.reduceat(terms, offsets[:-1][nz]) if nz.any() else np.zeros(0, np.uint64)
                h[nz] = sums
            h = mix64(mix64(h ^ base) ^ lengths.astype(np.uint64))
        else:
            valid = np.ones(len(arr), bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
            if pa.types.is_boolean(t):
                bits = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
            elif pa.types.is_floating(t):
                f = arr.cast(pa.float64()).fill_null(0).to_numpy()
                bits = (f + 0.0).view(np.uint64)  # -0.0 and 0.0 hash alike
            elif pa.types.is_uint64(t):
                # The bit pattern itself: equal to the int64 route below for
                # values under 2^63, and defined for the values above it.
                bits = arr.fill_null(0).to_numpy().astype(np.uint64, copy=False)
            elif pa.types.is_integer(t) or (pa.types.is_temporal(t) and not pa.types.is_interval(t)):
                if pa.types.is_temporal(t) and t.bit_width == 32:
                    # date32 / time32 cast to int64 only through their storage type.
                    arr = arr.cast(pa.int32())
                bits = arr.cast(pa.int64()).fill_null(0).to_numpy().view(np.uint64)
            else:
                raise TypeError(f"cannot hash values of type {t}")
            h = mix64(mix64(bits ^ base))
    return np.where(valid, h, np.uint64(0))
