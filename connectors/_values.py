"""Values pyarrow's text readers would change, or could not commit, found before
they are kept: integers float64 would round, and values nested too deep.

pyarrow's JSON and CSV readers type a column from its values: a column holding
an integer beyond the int64 range, or integers next to fractions, becomes
float64, and an integer of magnitude 2**53 or more then silently loses digits
(``99999999999999999999999`` becomes ``1e23``; ``9007199254740993`` next to
``1.5`` becomes ``9007199254740992``). Every integer below 2**53 is exact in
float64, so only an integral float64 value of magnitude >= 2**53 can be such a
rounded integer. Those are found over whole columns (nested lists and structs
included) with Arrow compute; only their rows' source text is then looked at,
to tell a float the input wrote (``1e23``) from an integer it did not keep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors._errors import printable

#: Float64 holds every integer of smaller magnitude exactly.
EXACT_LIMIT = 2.0**53

#: Most levels of lists and structs a column may have. Arrow's IPC format (how
#: Ray moves blocks) refuses 64 levels, and Parquet readers refuse a schema 100
#: nodes deep, where each list level takes two: beyond this a committed dataset
#: could not be read back.
MAX_NESTING = 32

# A path into a column: field names, and None for "an element of a list".
Path = tuple[str | None, ...]

# A rounded literal has at least 16 digits (2**53 has 16): a source line
# without such a run holds none.
_LONG_DIGITS = re.compile(rb"\d{16}")
_INT_TEXT = re.compile(r"\s*[+-]?\d+\s*")


def candidates(table: pa.Table) -> dict[int, list[Path]]:
    """Row -> paths of the integral float64 values of magnitude >= 2**53 in that
    row (the only values that can be rounded integers)."""
    found: dict[int, list[Path]] = {}
    for name, column in zip(table.column_names, table.columns):
        base = 0
        for chunk in column.chunks:
            for rows, path in _leaves(chunk, None, (name,)):
                for r in (rows + base).tolist():
                    paths = found.setdefault(r, [])
                    if path not in paths:
                        paths.append(path)
            base += len(chunk)
    return found


def _leaves(arr: pa.Array, rows: np.ndarray | None, path: Path) -> Iterator[tuple[np.ndarray, Path]]:
    stack = [(arr, rows, path)]  # not recursive: nesting depth is the input's
    while stack:
        arr, rows, path = stack.pop()
        t = arr.type
        if pa.types.is_floating(t):
            big = pc.and_(pc.greater_equal(pc.abs(arr), EXACT_LIMIT), pc.equal(pc.floor(arr), arr))
            idx = np.flatnonzero(pc.fill_null(big, False).to_numpy(zero_copy_only=False))
            if idx.size:
                yield (idx if rows is None else rows[idx]), path
        elif pa.types.is_struct(t):
            for field, child in zip(t, arr.flatten()):
                stack.append((child, rows, (*path, field.name)))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
            stack.append((arr.flatten(), parents if rows is None else rows[parents], (*path, None)))


def nesting(t: pa.DataType) -> int:
    """Levels of lists and structs in ``t`` (0 for a scalar type)."""
    deepest, stack = 0, [(t, 0)]
    while stack:
        t, level = stack.pop()
        deepest = max(deepest, level)
        if pa.types.is_struct(t):
            stack += [(f.type, level + 1) for f in t]
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            stack.append((t.value_type, level + 1))
    return deepest


def json_nesting(value: object) -> int:
    """Levels of arrays and objects in a parsed JSON value (0 for a scalar)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, dict):
            stack += [(x, level + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, level + 1) for x in v]
        else:
            deepest = max(deepest, level)
            continue
        deepest = max(deepest, level + 1)
    return deepest


def too_deep(schema: pa.Schema) -> tuple[str, int] | None:
    """``(column, levels)`` of the first column nested deeper than
    :data:`MAX_NESTING`, or None."""
    for field in schema:
        levels = nesting(field.type)
        if levels > MAX_NESTING:
            return printable(field.name, 80), levels
    return None


def column_name(path: Path) -> str:
    """``a.b[]`` for field ``b`` of the struct elements of list column ``a``."""
    out = ""
    for key in path:
        out += "[]" if key is None else (f".{key}" if out else key)
    return printable(out, 80)


def rounded(value: object) -> bool:
    """True for an integer (not a bool) that float64 cannot hold exactly."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        return float(value) != value
    except OverflowError:
        return True


def _rounded_at(value: object, path: Path) -> int | None:
    """The first integer under ``path`` in a parsed JSON value that float64 rounds."""
    if not path:
        return value if rounded(value) else None  # type: ignore[return-value]
    key, rest = path[0], path[1:]
    if key is None:
        for item in value if isinstance(value, list) else ():
            hit = _rounded_at(item, rest)
            if hit is not None:
                return hit
        return None
    return _rounded_at(value.get(key), rest) if isinstance(value, dict) else None


def shown(value: int) -> str:
    """An integer for a message, bounded (user data)."""
    text = str(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} digits)"


def rounded_json_rows(table: pa.Table, line_of: Callable[[int], bytes]) -> dict[int, str]:
    """Row -> ``"column 'x' holds the integer N"`` for each row of ``table``
    (read from JSON lines; ``line_of(row)`` is its source line) whose integer
    float64 rounded."""
    out: dict[int, str] = {}
    for row, paths in candidates(table).items():
        line = line_of(row)
        if not _LONG_DIGITS.search(line):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        for path in paths:
            hit = _rounded_at(obj, path)
            if hit is not None:
                out[row] = f"column {column_name(path)!r} holds the integer {shown(hit)}"
                break
    return out


def rounded_csv_rows(
    table: pa.Table, as_text: Callable[[list[str]], pa.Table]
) -> dict[int, tuple[str, str]]:
    """As :func:`rounded_json_rows` for a CSV table, with each value's text;
    ``as_text(names)`` re-reads those columns of the same records as strings."""
    found = candidates(table)
    if not found:
        return {}
    text = as_text(sorted({p[0] for paths in found.values() for p in paths}))
    out: dict[int, tuple[str, str]] = {}
    for row, paths in found.items():
        for (name, *_) in paths:  # CSV columns are flat
            raw = text.column(name)[row].as_py()
            if raw is None or not _INT_TEXT.fullmatch(raw):
                continue
            try:
                value = int(raw)
            except ValueError:  # more digits than Python converts: no float64 either
                why = f"column {column_name((name,))!r} holds an integer of {len(raw.strip())} digits"
                out[row] = (why, raw)
                break
            if rounded(value):
                out[row] = (f"column {column_name((name,))!r} holds the integer {shown(value)}", raw)
                break
    return out


#: Why a column nested deeper than MAX_NESTING is refused, for a message.
DEPTH_ADVICE = (
    f"at most {MAX_NESTING} levels of arrays and objects can be committed to Parquet "
    "and read back"
)

#: Why such a value is refused, for a message: "holds the integer N, which " + ADVICE.
ADVICE = (
    "float64 would round (the column is read as float64 because it holds an integer "
    "beyond the int64 range, or fractions, and float64 keeps integers exactly only "
    "below 2**53)"
)
