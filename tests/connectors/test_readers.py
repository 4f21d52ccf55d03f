"""Readers over local disk and the GCS emulator: projection, shuffle, provenance, errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import (
    BadRecordError,
    CorruptFileError,
    SpecError,
    read_csv,
    read_jsonl,
    read_parquet,
    read_text,
)
from tests._harness import put_bytes


def _parquet_bytes(table: pa.Table, **kw) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kw)
    return sink.getvalue().to_pybytes()


def _rows(ds):
    return sorted(ds.take_all(), key=lambda r: (r.get("_sf_file", ""), r.get("_sf_row", 0), str(r)))


@pytest.fixture
def parquet_dir(base_uri):
    for i in range(3):
        t = pa.table({"id": list(range(i * 10, i * 10 + 10)), "x": [float(i)] * 10, "s": ["a"] * 10})
        put_bytes(f"{base_uri}/raw/part-{i}.parquet", _parquet_bytes(t, row_group_size=3))
    return f"{base_uri}/raw"


def test_read_parquet_projection_and_provenance(ray_cluster, parquet_dir):
    ds = read_parquet(parquet_dir, columns=["id"], provenance=True)
    rows = _rows(ds)
    assert len(rows) == 30
    assert set(rows[0]) == {"id", "_sf_file", "_sf_row"}
    by_file = {r["_sf_file"] for r in rows}
    assert by_file == {"part-0.parquet", "part-1.parquet", "part-2.parquet"}
    # Row index within each file, across row groups of 3 rows.
    assert [r["_sf_row"] for r in rows if r["_sf_file"] == "part-1.parquet"] == list(range(10))
    assert [r["id"] for r in rows if r["_sf_file"] == "part-1.parquet"] == list(range(10, 20))


def test_read_parquet_glob(ray_cluster, parquet_dir):
    ds = read_parquet(f"{parquet_dir}/part-[01].parquet")
    assert ds.count() == 20


def test_seeded_file_shuffle_is_deterministic(ray_cluster, parquet_dir):
    def order(seed):
        return [r["id"] for r in read_parquet(parquet_dir, shuffle_seed=seed).iter_rows()]

    a, b = order(7), order(7)
    assert a == b and sorted(a) == list(range(30))
    orders = {tuple(order(s)) for s in range(6)}
    assert len(orders) > 1, "different seeds never changed the file order"


def test_unknown_column_names_file_and_available(ray_cluster, parquet_dir):
    with pytest.raises(Exception, match=r"column\(s\) \['nope'\] not found; available: id, x, s"):
        read_parquet(parquet_dir, columns=["nope"]).take_all()


def test_missing_path_raises_file_not_found_naming_uri(ray_cluster, base_uri):
    with pytest.raises(FileNotFoundError, match="missing-dir"):
        read_parquet(f"{base_uri}/missing-dir")
    with pytest.raises(FileNotFoundError, match="nothing"):
        read_jsonl(f"{base_uri}/nothing/*.jsonl")


def test_corrupt_parquet_names_file(ray_cluster, parquet_dir):
    put_bytes(f"{parquet_dir}/part-9.parquet", b"PAR1 this is not parquet")
    with pytest.raises(Exception) as e:
        read_parquet(parquet_dir).take_all()
    assert e.errisinstance(CorruptFileError) or "CorruptFileError" in str(e.value)
    assert "part-9.parquet is not a readable Parquet file" in str(e.value)


def test_read_jsonl(ray_cluster, base_uri):
    lines = [json.dumps({"text": f"doc {i}", "n": i}) for i in range(5)]
    put_bytes(f"{base_uri}/j/a.jsonl", ("\n".join(lines) + "\n").encode())
    rows = _rows(read_jsonl(f"{base_uri}/j", provenance=True))
    assert [r["n"] for r in rows] == list(range(5))
    assert [r["_sf_row"] for r in rows] == list(range(5))


def test_invalid_jsonl_line_names_file_and_line(ray_cluster, base_uri):
    body = b'{"text": "ok"}\n{"text": "ok2"}\n{"text": truncated\n'
    put_bytes(f"{base_uri}/j/bad file.jsonl", body)
    with pytest.raises(Exception) as e:
        read_jsonl(f"{base_uri}/j").take_all()
    assert e.errisinstance(BadRecordError) or "BadRecordError" in str(e.value)
    assert "bad file.jsonl: line 3 (row 2) is not valid JSON" in str(e.value)


def test_jsonl_integer_float64_would_round_is_found_in_nested_values(ray_cluster, base_uri):
    """An integer float64 would round is refused wherever it sits (a list element,
    a struct field), next to float literals that are kept; marked, only its
    line is bad and the column is read again without it."""
    lines = [
        b'{"id": 0, "v": [1.5, 2.5], "s": {"x": 1e23}}',
        b'{"id": 1, "v": [1.5, 9007199254740993], "s": {"x": 0.5}}',
        b'{"id": 2, "v": [], "s": {"x": 18446744073709551615}}',
        b'{"id": 3, "v": [4.0], "s": {"x": 1e20}}',
    ]
    uri = f"{base_uri}/nested.jsonl"
    put_bytes(uri, b"\n".join(lines) + b"\n")
    with pytest.raises(BadRecordError, match=r"nested\.jsonl: line 2 \(row 1\): column 'v\[\]' "
                                             r"holds the integer 9007199254740993"):
        read_jsonl(uri).take_all()
    got = read_jsonl(uri, provenance=True, mark_errors=True).take_all()
    bad = {r["_sf_row"]: r["_sf_error"] for r in got if r["_sf_error"]}
    assert sorted(bad) == [1, 2]
    assert "column 's.x' holds the integer 18446744073709551615" in bad[2]
    good = sorted((r for r in got if not r["_sf_error"]), key=lambda r: r["id"])
    assert [(r["id"], r["v"], r["s"]) for r in good] == [
        (0, [1.5, 2.5], {"x": 1e23}), (3, [4.0], {"x": 1e20})]


def test_csv_header_naming_a_column_twice_is_reported_before_its_records(ray_cluster, base_uri):
    """A file's own error (a column named twice) comes before a record's (an
    integer float64 would round), whatever the order of the checks."""
    uri = f"{base_uri}/twice.csv"
    put_bytes(uri, b"a,a,b\n1.5,1,x\n9007199254740993,2,y\n")
    with pytest.raises(SpecError, match=r"twice\.csv: column 'a' appears twice"):
        read_csv(uri).take_all()


def test_jsonl_records_are_numbered_alike_with_and_without_bad_records(ray_cluster, base_uri):
    """pyarrow reads two objects on one line (or lines ended by a lone CR) as two
    rows. The bad-record path numbered records by line, so one bad line
    elsewhere in the file shifted the row identity of every later record."""
    uri = f"{base_uri}/several.jsonl"
    body = b'{"x":1} {"x":2}\n{"x":3}\n%s{"x":4}\r{"x":5}\n'
    put_bytes(uri, body % b"")
    clean = read_jsonl(uri, provenance=True).take_all()
    put_bytes(uri, body % b"not json\n")
    marked = read_jsonl(uri, provenance=True, mark_errors=True).take_all()
    assert sorted((r["x"], r["_sf_row"]) for r in clean) == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    good = sorted((r["x"], r["_sf_row"]) for r in marked if not r["_sf_error"])
    assert good == [(1, 0), (2, 1), (3, 2), (4, 4), (5, 5)]
    assert [(r["_sf_row"], r["_sf_raw"]) for r in marked if r["_sf_error"]] == [(3, b"not json")]


def test_a_column_left_out_is_not_refused_for_what_it_holds(ray_cluster, base_uri):
    """With ``columns=["a"]`` a rounded integer in column ``b`` failed the file,
    though ``b`` is never read into the dataset."""
    for name, body in (("left.jsonl", b'{"a":1,"b":9007199254740993}\n{"a":2,"b":1.5}\n'),
                       ("left.csv", b"a,b\n1,9007199254740993\n2,1.5\n")):
        uri = f"{base_uri}/{name}"
        put_bytes(uri, body)
        read = read_jsonl if name.endswith("jsonl") else read_csv
        assert sorted(r["a"] for r in read(uri, columns=["a"]).take_all()) == [1, 2]


def test_read_csv(ray_cluster, base_uri):
    put_bytes(f"{base_uri}/c/a.csv", b"id,name,score\n1,a,0.5\n2,b,1.5\n")
    rows = read_csv(f"{base_uri}/c", columns=["id", "score"]).take_all()
    assert rows == [{"id": 1, "score": 0.5}, {"id": 2, "score": 1.5}]


def test_read_text_lines(ray_cluster, base_uri):
    put_bytes(f"{base_uri}/t/a.txt", b"first\r\nsecond\n\nfourth\n")
    rows = read_text(f"{base_uri}/t", provenance=True).take_all()
    assert [r["text"] for r in rows] == ["first", "second", "", "fourth"]
    rows = read_text(f"{base_uri}/t", provenance=True, drop_empty_lines=True).take_all()
    assert [(r["text"], r["_sf_row"]) for r in rows] == [("first", 0), ("second", 1), ("fourth", 3)]


def test_read_text_invalid_utf8_names_line(ray_cluster, base_uri):
    put_bytes(f"{base_uri}/t/latin1.txt", b"ok\nstill ok\ncaf\xe9\n")
    with pytest.raises(Exception, match=r"latin1.txt: line 3 \(row 2\) is not valid UTF-8"):
        read_text(f"{base_uri}/t").take_all()


def test_spec_error_is_value_error():
    assert issubclass(SpecError, ValueError)


@pytest.mark.parametrize("literal, why", [
    ("0e400", r"which pyarrow's JSON reader refuses \(an exponent past 308\)"),
    ("-1E400", r"which pyarrow's JSON reader refuses \(an exponent past 308\)"),
    ("0.1e310", r"which pyarrow's JSON reader refuses \(an exponent past 308\)"),
])
def test_jsonl_number_pyarrow_refuses_is_named(local_dir, literal, why):
    """pyarrow refuses "0e400" and "1e400" ("Number too big") where Python reads
    0.0 and inf: the error said "cannot be read as JSON lines", naming no line."""
    import re

    from slicefeed.connectors import peek_schema

    put_bytes(f"{local_dir}/a.jsonl", b'{"a": 1.5}\n{"a": %s}\n' % literal.encode())
    with pytest.raises(BadRecordError, match=rf"a\.jsonl: line 2 \(row 1\) holds the number "
                                             rf"{re.escape(literal)}, {why}"):
        peek_schema("jsonl", f"{local_dir}/a.jsonl")
