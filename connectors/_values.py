"""Values pyarrow's text readers would change, or could not commit, found before
they are kept: integers float64 would round, CSV numbers beyond float64's range
(pyarrow makes them infinite), values nested too deep, and JSON ``null`` records.

pyarrow's JSON and CSV readers type a column from its values: a column holding
an integer beyond the int64 range, or integers next to fractions, becomes
float64, and an integer of magnitude 2**53 or more then silently loses digits
(``99999999999999999999999`` becomes ``1e23``; ``9007199254740993`` next to
``1.5`` becomes ``9007199254740992``). Every integer below 2**53 is exact in
float64, so only an integral float64 value of magnitude >= 2**53 can be such a
rounded integer. Those are found over whole columns (nested lists and structs
included) with Arrow compute, and the source text is scanned with NumPy for
integer literals of 16 or more digits (2**53 has 16); only a row that has both,
a literal whose float64 value is one of the row's candidates, is parsed again
in Python, to tell a float the input wrote (``1e23``) from an integer it did
not keep. A file of large floats and no long integers costs two vectorised
passes.
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import re
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors._errors import printable

#: Float64 holds every integer of smaller magnitude exactly.
EXACT_LIMIT = 2.0**53

#: Text that spells an infinity (``inf``, ``-Infinity``, ``+INF``: any case, an
#: optional sign), as a CSV field may hold it, surrounding whitespace included.
#: A value written so is kept as infinite, not taken for an overflow; the one
#: pattern for readers and for ``cast`` (whose string-to-float cast refuses
#: whitespace, so on the values it accepts the whitespace never matters).
INFINITY_TEXT = r"^\s*[+-]?(?i:inf|infinity)\s*$"

#: Most levels of lists and structs a column may have. Arrow's IPC format (how
#: Ray moves blocks) refuses 64 levels, and Parquet readers refuse a schema 100
#: nodes deep, where each list level takes two: beyond this a committed dataset
#: could not be read back.
MAX_NESTING = 32

# A path into a column: field names, and None for "an element of a list".
Path = tuple[str | None, ...]

_DIGITS = 16  # a rounded integer literal has at least as many (2**53 has 16)
_JSON_WS = " \t\r\n"


def candidates(table: pa.Table) -> list[tuple[Path, np.ndarray, np.ndarray]]:
    """``(path, rows, magnitudes)`` of the integral float64 values of magnitude
    >= 2**53 (the only values that can be rounded integers), per column leaf."""
    found = []
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_floating(column.type):  # one pass over all chunks, usually all
            low, high = pc.min_max(column).values()
            if low.as_py() is None or (-EXACT_LIMIT < low.as_py() and high.as_py() < EXACT_LIMIT):
                continue
        base = 0
        for chunk in column.chunks:
            for rows, path, values in _leaves(chunk, None, (name,)):
                found.append((path, rows + base, values))
            base += len(chunk)
    return found


def _pairs(rows: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """(row, magnitude) pairs as one integer key each, to look up: equal
    pairs have equal keys; unequal ones may collide, which only costs a row
    parsed again to no effect."""
    bits = np.ascontiguousarray(magnitudes, dtype=np.float64).view(np.uint64)
    return (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ bits


def _leaves(
    arr: pa.Array, rows: np.ndarray | None, path: Path
) -> Iterator[tuple[np.ndarray, Path, np.ndarray]]:
    stack = [(arr, rows, path)]  # not recursive: nesting depth is the input's
    while stack:
        arr, rows, path = stack.pop()
        t = arr.type
        if pa.types.is_floating(t):
            big = pc.and_(pc.greater_equal(pc.abs(arr), EXACT_LIMIT), pc.equal(pc.floor(arr), arr))
            idx = np.flatnonzero(pc.fill_null(big, False).to_numpy(zero_copy_only=False))
            if idx.size:
                values = arr.take(pa.array(idx)).to_numpy(zero_copy_only=False)
                yield (idx if rows is None else rows[idx]), path, np.abs(values)
        elif pa.types.is_struct(t):
            for field, child in zip(t, arr.flatten()):
                stack.append((child, rows, (*path, field.name)))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
            stack.append((arr.flatten(), parents if rows is None else rows[parents], (*path, None)))


def _byte_class(chars: bytes) -> np.ndarray:
    table = np.zeros(256, bool)
    table[np.frombuffer(chars, np.uint8)] = True
    return table


_FRACTION_OR_EXPONENT = _byte_class(b".eE")
_EXPONENT = _byte_class(b"eE")


def int_literals(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets ``[start, end)`` of each integer literal of 16 or more digits
    in ``data`` (its sign included): runs of digits that are not a fraction's or
    an exponent's and are not followed by one. Found with NumPy; inside quoted
    text too (a superset)."""
    b = np.frombuffer(data, np.uint8)
    # window[i]: the 16 bytes from i are all digits (ANDs of shifted masks,
    # doubling the window each time; no per-run work unless a window exists).
    window = (b - np.uint8(48)) < 10  # "0".."9" (uint8 wraps below "0")
    width = 1
    while width < _DIGITS and window.size:
        window = window[:-width] & window[width:]
        width *= 2
    at = np.flatnonzero(window)
    if not at.size:
        return at, at
    # A run of digits is the consecutive window starts it holds, plus 15.
    first = np.r_[True, np.diff(at) > 1]
    last = np.r_[first[1:], True]
    starts, ends = at[first], at[last] + _DIGITS

    def byte_at(i: np.ndarray) -> np.ndarray:  # a space outside data
        inside = (i >= 0) & (i < b.size)
        return np.where(inside, b[np.clip(i, 0, b.size - 1)], 32)

    lead, after = byte_at(starts - 1), byte_at(ends)
    signed = (lead == ord("-")) | (lead == ord("+"))
    exponent = signed & _EXPONENT[byte_at(starts - 2)]
    keep = ~_FRACTION_OR_EXPONENT[lead] & ~exponent & ~_FRACTION_OR_EXPONENT[after]
    return np.where(signed, starts - 1, starts)[keep], ends[keep]


class _Huge(int):
    """An integer literal past Python's conversion limit; no float64 holds it."""

    digits = 0

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def parse_int(text: str | bytes) -> int:
    try:
        return int(text)
    except ValueError:
        huge = _Huge()
        huge.digits = len(text.strip().lstrip("+-" if isinstance(text, str) else b"+-"))
        return huge


def rounded(value: object) -> bool:
    """True for an integer (not a bool) that float64 cannot hold exactly."""
    if isinstance(value, _Huge):
        return True
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        return float(value) != value
    except OverflowError:
        return True


def shown(value: int) -> str:
    """An integer for a message, bounded (user data)."""
    if isinstance(value, _Huge):
        return repr(value)
    text = str(value)
    return f"the integer {text}" if len(text) <= 40 else f"the integer {text[:24]}... ({len(text)} digits)"


def column_name(path: Path) -> str:
    """``a.b[]`` for field ``b`` of the struct elements of list column ``a``."""
    out = ""
    for key in path:
        out += "[]" if key is None else (f".{key}" if out else key)
    return printable(out, 80)


def _rounded_at(value: object, path: Path) -> int | float | None:
    """The first integer under ``path`` in a parsed JSON value that float64
    rounds, or number literal it cannot hold (an ``_Overflow``)."""
    if not path:
        return value if rounded(value) or isinstance(value, _Overflow) else None  # type: ignore[return-value]
    key, rest = path[0], path[1:]
    if key is None:
        for item in value if isinstance(value, list) else ():
            hit = _rounded_at(item, rest)
            if hit is not None:
                return hit
        return None
    return _rounded_at(value.get(key), rest) if isinstance(value, dict) else None


def _record_starts(data: bytes, num_rows: int) -> np.ndarray:
    """Byte offset of each of the ``num_rows`` records pyarrow read from JSON
    lines ``data``.

    When every non-blank line starts with ``{`` and ends with ``}`` (a CR
    aside), no object can span lines (the next line's ``{`` could not continue
    it), so each such line holds whole objects, and as many lines as rows means
    one object per line: the common case, vectorised over line ends. Otherwise
    the objects are walked as pyarrow reads them (several on a line, across
    lines, a lone CR, a byte-order mark), in linear time.

    Raises:
        ValueError: the text does not parse as ``num_rows`` JSON values.
    """
    b = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(b == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.append(newlines, b.size)
    keep = starts < ends
    starts, ends = starts[keep], ends[keep]
    last = b[ends - 1]
    cr = last == 13
    blank = cr & (ends - starts == 1)
    last = np.where(cr & ~blank, b[np.maximum(ends - 2, 0)], last)
    whole = (b[starts] == ord("{")) & (last == ord("}"))
    if bool(np.all(whole | blank)) and int(whole.sum()) == num_rows:
        return starts[whole]
    text = data.decode("utf-8", "surrogateescape")
    ascii_only = len(text) == len(data)
    first = 1 if text.startswith("\ufeff") else 0  # pyarrow skips a byte-order mark
    decoder, out = json.JSONDecoder(parse_int=parse_int), []
    char, byte = first, len(text[:first].encode("utf-8"))
    for pos, end, _, error in json_values(text, decoder, first):
        if error is not None:
            raise ValueError(f"the text at byte {byte} does not parse as JSON")
        if not ascii_only:  # bytes up to this value, counted once per stretch
            byte += len(text[char:pos].encode("utf-8", "surrogateescape"))
            char = pos
        out.append(pos if ascii_only else byte)
    if len(out) != num_rows:
        raise ValueError(f"{len(out)} JSON values for {num_rows} rows")
    return np.asarray(out, dtype=np.int64)


# pyarrow's JSON reader also reads `Inf`, `-Inf` and `-NaN` as numbers; Python's
# parser does not. Outside strings (each string is one token of the pattern, so
# a constant inside one is never matched), Python's spelling of the same value
# stands in for each (`-NaN` is NaN to pyarrow too).
_STRING_OR_PYARROW_ONLY = re.compile(r'"(?:[^"\\\n]|\\.)*"|(-?Inf(?!inity)|-NaN)')
_PYTHON_SPELLING = {"Inf": "Infinity", "-Inf": "-Infinity", "-NaN": "NaN"}


def decode(decoder: json.JSONDecoder, text: str, pos: int = 0) -> tuple[object, int]:
    """``decoder.raw_decode(text, pos)``, reading what pyarrow reads: a value
    holding ``Inf``, ``-Inf`` or ``-NaN`` decodes as one holding Python's
    spelling of it. Only where Python's parser stops are the value's lines
    copied with those constants respelled and parsed again (linear in their
    length overall).

    Raises:
        json.JSONDecodeError: the position is in ``text``.
        RecursionError: the value is nested deeper than Python's stack allows.
    """
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError as e:
        error = e
    parts: list[str] = []
    marks: list[int] = []  # where in the copy each respelled constant ends
    shifts: list[int] = [0]  # how much longer the copy is up to there
    taken = pos  # text[pos:taken] is copied

    def respell(found: re.Match) -> str:
        if found.group(1) is None:
            return found.group()
        spelled = _PYTHON_SPELLING[found.group(1)]
        marks.append(taken - pos + found.start() + shifts[-1] + len(spelled))
        shifts.append(shifts[-1] + len(spelled) - len(found.group(1)))
        return spelled

    def in_text(at: int) -> int:  # a position of the copy in the text
        return pos + at - shifts[bisect.bisect_right(marks, at)]

    while error.pos >= taken and taken < len(text):
        # Copy whole lines up to the stop, at least doubling the copy: a value
        # over many lines is parsed a logarithmic number of times, not once a line.
        line_end = text.find("\n", max(error.pos, 2 * taken - pos))
        line_end = len(text) if line_end < 0 else line_end + 1
        parts.append(_STRING_OR_PYARROW_ONLY.sub(respell, text[taken:line_end]))
        taken = line_end
        try:
            value, end = decoder.raw_decode("".join(parts))
            return value, in_text(end)
        except json.JSONDecodeError as e:
            error = json.JSONDecodeError(e.msg, text, in_text(e.pos))
    raise error


def json_values(
    text: str, decoder: json.JSONDecoder, pos: int = 0
) -> Iterator[tuple[int, int, object, Exception | None]]:
    """``(start, end, value, error)`` of each JSON value in ``text`` from ``pos``,
    as pyarrow reads them: separated by JSON whitespace (a lone CR included). At
    the first text that does not parse, ``error`` is set, ``end`` is the text's
    end, and the walk stops."""
    while True:
        while pos < len(text) and text[pos] in _JSON_WS:
            pos += 1
        if pos >= len(text):
            return
        try:
            value, end = decode(decoder, text, pos)
        except (ValueError, RecursionError) as e:
            yield pos, len(text), None, e
            return
        yield pos, end, value, None
        pos = end


# `null` as a record is first in the text, follows a record's closing brace,
# or starts a line (after a record that is not an object, too: pyarrow parses
# 1 MiB blocks cut at line ends in parallel, and a block that starts with
# `null` crashes it whatever came before). A JSON string holds no raw line
# end, so a line-leading `null` is a record or a value of a record written
# over several lines. Each pattern starts with a literal byte: a fast scan
# (a class of first bytes is ten times slower).
_NULL_FIRST = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*null")
_NULL_AFTER = {lead: re.compile(re.escape(lead) + rb"[ \t\r\n]*null") for lead in (b"}", b"\n", b"\r")}
#: Python's JSON parser without hooks: where a record ends, what it holds.
PLAIN_DECODER = json.JSONDecoder()


def null_record(data: bytes) -> bool:
    """Whether a record of JSON-lines ``data`` is JSON ``null``.

    pyarrow reads such a record as a row of nulls in every column, and one that
    starts the text or one of its parse blocks crashes its reader (a
    segmentation fault), so it must be found before pyarrow reads the text.
    Candidates are found with up to three regular-expression searches (literal-led
    patterns: fast scans); only text with one is walked in Python, to tell a
    record from ``} null`` inside a string or a value on its own line.
    Where Python's parser stops before the end (pyarrow also reads deeper
    nesting and longer integers; its ``Inf`` and ``-NaN`` are read here too, see
    :func:`decode`), what follows cannot be told apart, so the answer is yes:
    the caller's bad-record walk decides.
    """
    if _NULL_FIRST.match(data) is None and not any(
            (lead != b"\r" or lead in data) and pattern.search(data)  # a CR is rare
            for lead, pattern in _NULL_AFTER.items()):
        return False
    text = data.decode("utf-8", "surrogateescape")
    start = 1 if text.startswith("\ufeff") else 0
    return any(error is not None or value is None
               for _, _, value, error in json_values(text, PLAIN_DECODER, start))


def float_change(text: str) -> str | None:
    """Why pyarrow's JSON reader refuses or changes the number literal ``text``
    (one with a point or an exponent), or None: its exponent, less the digits
    after the point, passes 308 ("1e400", "0e400": pyarrow refuses "Number too
    big"), or float64 makes it infinite ("1.8e308"; pyarrow reads inf)."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent:
        digits = exponent.lstrip("+-").lstrip("0")
        # Compared by length first: int() refuses 4,300+ digits.
        big = len(digits) > 9 or int(digits or "0") - len(mantissa.partition(".")[2]) > 308
        if big and not exponent.startswith("-"):
            return ("which pyarrow's JSON reader refuses (an exponent past 308); write it "
                    "with a smaller exponent")
    if math.isinf(float(text)):
        return "beyond the range of float64, which would make it infinite"
    return None


def _may_overflow(data: bytes) -> bool:
    """Whether ``data`` may hold a number literal float64 makes infinite: one
    has an exponent of 3+ digits or a run of 309+ digits (vectorised; digits
    in strings count too, which only costs a recheck)."""
    b = np.frombuffer(data, np.uint8)
    if b.size < 4:
        return False
    digit = (b >= 48) & (b <= 57)
    e = np.flatnonzero((b[:-3] | 0x20) == ord("e"))
    after = e + (b[e + 1] == ord("+"))  # the exponent's sign, if any
    after = after[after + 3 < b.size]
    if np.any(digit[after + 1] & digit[after + 2] & digit[after + 3]):
        return True
    edges = np.diff(digit.astype(np.int8), prepend=0, append=0)
    return bool(np.any(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1) >= 309))


class _Overflow(float):
    """A JSON number literal pyarrow made infinite (see :func:`float_change`)."""

    text = ""


def _overflow(text: str) -> float:
    value = float(text)
    if math.isinf(value) and float_change(text) is not None:
        value = _Overflow(value)
        value.text = text
    return value


def rounded_json_rows(table: pa.Table, data: bytes) -> dict[int, tuple[int, str]]:
    """Row -> (byte offset of its record, why) for each row of ``table`` (read
    by pyarrow from JSON lines ``data``) with a value float64 changed: an
    integer it rounded (``"column 'x' holds the integer N, which " + ADVICE``),
    or a number literal beyond its range that pyarrow made infinite
    (``1.8e308``; ``Infinity`` as written is kept).

    A row is parsed again only if an integer literal in its text has the
    float64 value of one of its candidates, or it holds an infinity;
    everything before is vectorised.

    Raises:
        ValueError: there are candidates, but the records cannot be found in the
            text (the caller refuses the file rather than guess).
    """
    found = candidates(table)  # infinities are integral and beyond 2**53: among them
    if not found:
        return {}
    suspects: dict[int, list[Path]] = {}
    if _may_overflow(data):  # else every infinity was written as such (Infinity, Inf)
        for path, rows, magnitudes in found:
            for row in dict.fromkeys(rows[np.isinf(magnitudes)].tolist()):
                suspects.setdefault(row, []).append(path)
    lo_tok, hi_tok = int_literals(data)
    if not lo_tok.size and not suspects:
        return {}
    starts = _record_starts(data, table.num_rows)
    literal_rows: set[int] = set()  # rows holding a long integer literal
    if lo_tok.size:
        token_rows = np.searchsorted(starts, lo_tok, side="right") - 1
        token_values = np.abs(np.fromiter(
            (float(data[lo:hi]) for lo, hi in zip(lo_tok.tolist(), hi_tok.tolist())),
            np.float64, lo_tok.size))
        tokens = np.sort(_pairs(token_rows, token_values))
        for path, rows, magnitudes in found:
            keys = _pairs(rows, magnitudes)
            at = np.minimum(np.searchsorted(tokens, keys), tokens.size - 1)
            hit = tokens[at] == keys
            for row in dict.fromkeys(rows[hit].tolist()):
                suspects.setdefault(row, []).append(path)
                literal_rows.add(row)
    out: dict[int, tuple[int, str]] = {}
    decoder = json.JSONDecoder(parse_int=parse_int, parse_float=_overflow)
    for row, paths in sorted(suspects.items()):  # parse those rows again
        lo = int(starts[row])
        end = int(starts[row + 1]) if row + 1 < starts.size else len(data)
        text = data[lo:end].decode("utf-8", "surrogateescape")
        pos = len(text) - len(text.lstrip(_JSON_WS))
        try:
            obj, _ = decode(decoder, text, pos)
        except (ValueError, RecursionError):  # pyarrow read what Python does not
            if row not in literal_rows and not _may_overflow(data[lo:end]):
                continue  # its infinities are written as such
            raise ValueError(f"row {row} holds a possibly changed number and does not "
                             "parse again") from None
        for path in paths:
            value = _rounded_at(obj, path)
            if value is None:
                continue
            column = column_name(path)
            why = (f"column {column!r} holds {printable(value.text, 40)}, "
                   f"{float_change(value.text)}"
                   if isinstance(value, _Overflow) else
                   f"column {column!r} holds {shown(value)}, which {ADVICE}")
            out[row] = (lo, why)
            break
    return out


def rounded_csv_rows(
    table: pa.Table, data: bytes, as_text: Callable[[list[str]], pa.Table]
) -> dict[int, tuple[str, str]]:
    """Row -> (why, the value's text) for each row of a CSV ``table`` (read
    from ``data``) with a value float64 changed: an integer it rounded
    (``"column 'x' holds the integer N, which " + ADVICE``) or a number beyond
    its range that became infinite (``1e400``; ``inf`` as written is kept).
    ``as_text(names)`` re-reads those columns of the same records as strings."""
    found = candidates(table)  # infinities are integral and beyond 2**53: among them
    infinite = [bool(np.isinf(magnitudes).any()) for _, _, magnitudes in found]
    if not any(infinite) and (not found or not int_literals(data)[0].size):
        return {}
    names = sorted({path[0] for path, _, _ in found})
    text = as_text(names)
    out: dict[int, tuple[str, str]] = {}
    for ((name, *_), rows, magnitudes), inf in zip(found, infinite):
        # CSV columns are flat: one leaf per column
        values = text.column(name).take(pa.array(rows))
        column = column_name((name,))
        ints = pc.fill_null(pc.match_substring_regex(values, r"^\s*[+-]?\d+\s*$"), False)
        for i in np.flatnonzero(ints.to_numpy(zero_copy_only=False)).tolist():
            row, raw = int(rows[i]), values[i].as_py()
            value = parse_int(raw)
            if row not in out and rounded(value):
                out[row] = (f"column {column!r} holds {shown(value)}, which {ADVICE}", raw)
        if inf:
            spelled = pc.match_substring_regex(values, INFINITY_TEXT)
            over = np.isinf(magnitudes) & ~pc.fill_null(spelled, False).to_numpy(
                zero_copy_only=False)
            for i in np.flatnonzero(over).tolist():
                row, raw = int(rows[i]), values[i].as_py()
                why = (f"column {column!r} holds {printable(raw.strip(), 40)}, beyond the "
                       "range of float64, which would make it infinite")
                out.setdefault(row, (why, raw))
    return out


_SIGN = _byte_class(b"+-")
#: A number whose text starts like this is not written as its value prints:
#: a leading zero (``02139``), a plus sign (``+15551234567``) or a hexadecimal
#: prefix (``0x1F``, which pyarrow types as the integer 31).
_NOT_AS_PRINTED = r"^\s*(?:[+-]?0\d|\+|0[xX])"


def _padded_number_candidates(data: bytes, delimiter: str) -> bool:
    """Whether ``data`` may hold a CSV field that starts ``0`` + a digit, ``x``
    or ``X`` (after an optional sign) or ``+``: a superset, found with NumPy over
    the text, then over its hits only (1-4 ms per MB; times, dense in zeros,
    cost the most)."""
    b = np.frombuffer(data, np.uint8)
    if b.size < 3:
        return False
    starts = _byte_class(b'\n\r" \t' + delimiter.encode())
    if data.find(b"+") >= 0:  # any "+" starting a field ("+inf" is a number too)
        plus = np.flatnonzero(b[1:-1] == ord("+")) + 1
        if starts[b[plus - 1]].any():
            return True
    zero = b[1:-1] == ord("0")
    zero &= ((b[2:] - np.uint8(48)) < 10) | ((b[2:] | np.uint8(0x20)) == ord("x"))  # uint8 wraps below "0"
    at = np.flatnonzero(zero) + 1
    if delimiter != ":":  # "00:00", a time (with ":" between fields, a number)
        at = at[b[np.minimum(at + 2, b.size - 1)] != ord(":")]
    lead = b[at - 1]
    return bool((starts[lead] | (_SIGN[lead] & starts[b[np.maximum(at - 2, 0)]])).any())


def numbers_as_written(
    table: pa.Table, data: bytes, delimiter: str, as_text: Callable[[list[str]], pa.Table],
    names: list[str] | None = None,
) -> pa.Table:
    """``table`` (read from CSV text ``data``) with each numeric column that
    holds a number pyarrow would not print as written, a leading zero
    (``02139``), a plus sign (``+15551234567``) or a hexadecimal prefix
    (``0x1F``), replaced by its text: such values are identifiers more often
    than numbers, and the typed column would change them (``2139``,
    ``15551234567.0``, ``31``). ``names``: the columns to look
    at (default all). ``as_text(names)`` re-reads columns of the same records
    as strings."""
    if not _padded_number_candidates(data, delimiter):
        return table
    written = collections.Counter(table.column_names)  # a name written twice is refused elsewhere
    numeric = [f.name for f in table.schema
               if (names is None or f.name in names) and written[f.name] == 1
               and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                    or pa.types.is_decimal(f.type))]
    if not numeric:
        return table
    text = as_text(numeric)
    kept = {name: column for name, column in zip(text.column_names, text.columns)
            if pc.any(pc.match_substring_regex(column, _NOT_AS_PRINTED)).as_py()}
    if not kept:
        return table
    columns = [kept.get(name, column) for name, column in zip(table.column_names, table.columns)]
    fields = [f.with_type(pa.string()) if f.name in kept else f for f in table.schema]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


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
