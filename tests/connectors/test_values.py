"""Integers float64 would round: the vectorised scan and the row check, without Ray.

The readers' own tests (``test_readers.py``, ``tests/pipelines/test_hostile_records.py``)
cover the same through the public API and the pipeline; these pin the parts a
wrong offset would silently break: which text is an integer literal, and which
record a pyarrow row came from.
"""

from __future__ import annotations

import io
import re

import pyarrow as pa
import pyarrow.json as pajson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicefeed.connectors import _values


def _reference(data: bytes) -> list[tuple[int, int]]:
    out = []
    for m in re.finditer(rb"[0-9]+", data):
        lo, hi = m.span()
        lead, after = data[lo - 1:lo] if lo else b" ", data[hi:hi + 1] or b" "
        if hi - lo < 16 or lead in (b".", b"e", b"E") or after in (b".", b"e", b"E"):
            continue
        if lead in (b"+", b"-"):
            if data[lo - 2:lo - 1] in (b"e", b"E"):
                continue
            lo -= 1
        out.append((lo, hi))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"9", b"0", b"12345678", b".", b"e", b"E", b"+", b"-",
                                 b" ", b",", b'"', b"\n", b"a"]), max_size=60))
def test_int_literals_are_the_long_digit_runs_outside_fractions_and_exponents(parts):
    data = b"".join(parts)
    lo, hi = _values.int_literals(data)
    assert list(zip(lo.tolist(), hi.tolist())) == _reference(data)


def _rounded(data: bytes) -> dict[int, str]:
    table = pajson.read_json(io.BytesIO(data))
    return {row: why.split(", which ")[0]
            for row, (_, why) in _values.rounded_json_rows(table, data).items()}


def test_rows_are_found_where_pyarrow_read_several_objects_on_a_line():
    """pyarrow reads objects separated by spaces or a lone CR as rows of their
    own: the row a rounded integer is reported at is pyarrow's row."""
    for data in (b'{"x":1.5} {"x":2}\n{"x":9007199254740993}\n{"x":3}\n',
                 b'{"x":1.5}\r{"x":2}\r{"x":9007199254740993}\r'):
        assert _rounded(data) == {2: "column 'x' holds the integer 9007199254740993"}


def test_integer_past_the_conversion_limit_is_rounded():
    """An integer of 5,001 digits becomes inf in a float64 column."""
    data = b'{"x":1.5}\n{"x":1' + b"0" * 5000 + b"}\n"
    assert _rounded(data) == {1: "column 'x' holds an integer of 5001 digits"}


def test_floats_and_digits_in_strings_are_not_rounded_integers():
    data = (b'{"s":"9007199254740993","x":9007199254740993.0,"y":1e23,"id":1234567890123456789}\n'
            b'{"s":"a","x":1.5,"y":-9.007199254740993e15,"id":1}\n')
    assert _rounded(data) == {}


def test_rows_are_found_for_objects_spread_over_lines_and_after_a_byte_order_mark():
    """Counting lines is not counting records when an object spans lines: the
    row of a rounded integer was looked up in another row's text and missed."""
    data = b'{"x":\n1}\n{"c":1.5}{"c":9007199254740993}\n'
    assert _rounded(data) == {2: "column 'c' holds the integer 9007199254740993"}
    data = b'\xef\xbb\xbf{"a":9007199254740993}\n{"a":1.5}\n'
    assert _rounded(data) == {0: "column 'a' holds the integer 9007199254740993"}


def test_a_row_holding_constants_only_pyarrow_spells_is_checked():
    """pyarrow reads ``-NaN``, ``Inf`` and ``-Inf``; Python's parser does not.
    Such a row that may hold a rounded integer is checked all the same (it
    failed its whole file as one that cannot be checked)."""
    data = b'{"a":9007199254740993,"b":[-NaN, Inf, -Inf]}\n{"a":1.5,"b":[1]}\n'
    assert _rounded(data) == {0: "column 'a' holds the integer 9007199254740993"}


def test_a_row_python_cannot_parse_is_refused_not_passed():
    """A row that may hold a rounded integer and does not parse in Python (here
    nested past its recursion limit, which pyarrow reads) fails the file
    instead of passing."""
    data = b'{"a":9007199254740993,"b":' + b"[" * 2000 + b"1" + b"]" * 2000 + b'}\n{"a":1.5}\n'
    with pytest.raises(ValueError):
        _rounded(data)


def test_number_beyond_float64_pyarrow_made_infinite_is_found():
    """pyarrow reads 1.8e308 as inf without an error (it refuses only exponents
    past 308); Infinity as written is kept."""
    data = b'{"a":1.5}\n{"a":1.8e308}\n{"a":[2.5, -1.7976931348623159e308]}\n{"a":Infinity}\n'
    assert _rounded(data.replace(b"[2.5, ", b"").replace(b"]", b"")) == {
        1: "column 'a' holds 1.8e308, beyond the range of float64",
        2: "column 'a' holds -1.7976931348623159e308, beyond the range of float64"}
    assert _rounded(b'{"a":[1.5]}\n{"a":[2.5, 1.8e308]}\n') == {
        1: "column 'a[]' holds 1.8e308, beyond the range of float64"}


def test_infinities_written_as_such_are_kept_even_where_python_cannot_parse_them():
    """pyarrow also reads `Inf` and `-NaN`, which Python's parser refuses: a row
    holding one is not refused for it (every infinity there is written as such),
    and a 1.8e308 in another row is still found."""
    assert _rounded(b'{"a":Inf}\n{"a":1.5}\n') == {}
    assert _rounded(b'{"a":-Inf,"b":-NaN}\n{"a":Infinity,"b":1.5}\n') == {}
    assert _rounded(b'{"a":Inf}\n{"a":1.8e308}\n') == {
        1: "column 'a' holds 1.8e308, beyond the range of float64"}


@pytest.mark.parametrize("literal, refused, infinite", [
    ("1e400", True, False), ("0e400", True, False), ("0.1e310", True, False),
    ("-0.0e400", True, False), ("1e" + "0" * 20 + "400", True, False),
    ("0.001e309", False, False), ("1.8e308", False, True), ("10e308", False, True),
    ("1e308", False, False), ("1e-400", False, False),
    ("1e" + "0" * 5000 + "1", False, False), ("1e-" + "0" * 5000 + "1", False, False),
])
def test_float_change_agrees_with_pyarrow(literal, refused, infinite):
    """Which literals pyarrow's JSON reader refuses ("Number too big") or makes
    infinite; exponents of 4,300+ digits included (int() refuses those)."""
    data = b'{"a": %s}\n' % literal.encode()
    try:
        got = pajson.read_json(io.BytesIO(data)).column("a")[0].as_py()
        assert not refused and (got in (float("inf"), float("-inf"))) == infinite
    except pa.ArrowInvalid:
        assert refused
    why = _values.float_change(literal)
    assert (why is not None and "refuses" in why) == refused
    assert (why is not None and "infinite" in why) == infinite


@pytest.mark.parametrize("data, expected", [
    (b'{"a": 1}\nnull\n', True),
    (b'{"a": Inf}\nnull\n', True),            # after text Python's parser stops at
    (b'{"a": -NaN} null\n', True),
    (b"\xef\xbb\xbf  null\n", True),            # first, after a byte-order mark
    (b'{"a": 1} null\n', True),                 # after an object on the same line
    (b'{"a": 1}\r\n\t null \r\n{"a": 2}', True),
    (b'5\n null\n', True),                      # after a record that is not an object
    (b'{"a": 1}\rnull', True),                   # lines ended by a lone CR
    (b'{"a":\n null}\n{"a": 1}', False),      # a value on its own line
    (b'{"a": null}\n{"a": [null, {"b": null}]}\n', False),  # values, not records
    (b'{"a": "} null"}\n{"a": "x}\\nnull"}\n', False),       # inside strings
    (b"", False),
])
def test_null_record_is_found_and_null_values_are_not(data, expected):
    """pyarrow reads a `null` record as a row of nulls (and crashes on one that
    comes first), so it must be found in the text before pyarrow reads it."""
    assert _values.null_record(data) is expected
    if not expected and data.strip():
        assert pajson.read_json(io.BytesIO(data)).num_rows == 2


@pytest.mark.parametrize("lines", [1, 2, 3, 100, 5000])
def test_decode_reads_pyarrow_constants_in_a_value_over_many_lines(lines):
    """A value written over many lines (pretty-printed) holding `Inf` is read
    whole and its end is found in the original text (the copy is extended by
    at least doubling: one extra line at a time parsed it once per line)."""
    body = ",\n".join("-Inf" if i % 7 == 3 else " null" if i % 5 == 0 else f" {i}"
                      for i in range(lines))
    text = '{"a": Inf,\n "s": "Inf, \\" -NaN",\n "v": [\n' + body + '\n]}\n{"b": 1}'
    value, end = _values.decode(_values.PLAIN_DECODER, text)
    assert value["a"] == float("inf") and value["s"] == 'Inf, " -NaN'
    assert value["v"] == [float("-inf") if i % 7 == 3 else None if i % 5 == 0 else i
                          for i in range(lines)]
    assert text[end:] == '\n{"b": 1}'


@pytest.mark.parametrize("text, delimiter, kept_as_written", [
    (b"id,zip\n1,02139\n2,10001\n", ",", {"zip"}),        # a leading zero
    (b"id,n\n1,-08\n2,7\n", ",", {"n"}),                    # after a sign
    (b"id,phone\n1,+15551234567\n", ",", {"phone"}),        # a plus sign (typed float64)
    (b"id,x\n1,+inf\n2,1.5\n", ",", {"x"}),                 # a plus sign before a word
    (b"id,x\n1,\"+.5\"\n", ",", {"x"}),                     # quoted
    (b"id,h\n1,0x10\n2,0XfF\n", ",", {"h"}),               # hexadecimal (typed int64)
    (b"id,h\n1, 0x1f\n2,7\n", ",", {"h"}),                  # hexadecimal, padded
    (b"id\tzip\n1\t 0042\n", "\t", {"zip"}),                # tab-separated, padded
    (b"id:zip\n1:02\n2:-07\n", ":", {"zip"}),                # ":" between fields
    (b"id,x\n0,0.5\n10,-0.25\n", ",", set()),               # 0 before a point or alone
    (b"id,at\n1,2024-01-01 00:00:00\n", ",", set()),         # times hold zeros too
    (b"id,t\n1,x 0800\n2,1+2\n", ",", set()),               # inside text, or not a field start
])
def test_csv_numbers_not_written_as_they_print_are_read_as_written(text, delimiter,
                                                                   kept_as_written):
    """pyarrow's CSV reader types ``02139`` as 2139 and ``+1555...`` as a float:
    such a numeric column is read as the strings written; others keep their type."""
    from slicefeed.connectors._formats import read_csv_bytes

    table = read_csv_bytes(text, delimiter)
    as_strings = {f.name for f in table.schema if pa.types.is_string(f.type)} - {"at", "t"}
    assert as_strings == kept_as_written
    assert table.schema.field("id").type == pa.int64()
    for name in kept_as_written:
        written = [line.split(delimiter.encode())[1].strip(b'"').decode()
                   for line in text.splitlines()[1:]]
        assert table.column(name).to_pylist() == written


def test_csv_header_not_valid_utf8_is_arrow_invalid():
    """The readers name the file for pyarrow's ArrowInvalid; a header pyarrow
    reads but Python cannot decode raised a bare UnicodeDecodeError."""
    from slicefeed.connectors._formats import read_csv_bytes

    with pytest.raises(pa.ArrowInvalid, match="the header row is not valid UTF-8"):
        read_csv_bytes(b"\xff,b\n1,2\n", ",")
