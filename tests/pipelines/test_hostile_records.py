"""Hostile records: one bad line never takes its file's good rows with it, and
input cannot forge slicefeed's own bad-record markers.

Runs real pipelines on the session Ray cluster; `validate` through the CLI.
"""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import (
    SpecError,
    is_committed,
    read_dataset,
    read_manifest,
    resolve_filesystem,
)
from slicefeed.pipelines import Pipeline
from tests._harness import put_bytes, run_slicefeed

pytestmark = pytest.mark.timeout(300)


_slicefeed = run_slicefeed


def _spec(base: str, fmt: str, **kw) -> dict:
    spec = {"name": "hostile-records", "source": {"format": fmt, "uri": f"{base}/raw"},
            "sink": {"format": "parquet", "uri": f"{base}/out"}, "max_error_fraction": 0.01}
    spec.update(kw)
    return spec


def _quarantined(sink: str) -> list[dict]:
    q = resolve_filesystem(f"{sink}/_quarantine")
    if not q.fs.exists(q.path):
        return []
    rows = []
    for p in sorted(q.fs.find(q.path)):
        with q.fs.open(p, "rb") as f:
            rows += pq.read_table(f).to_pylist()
    return rows


def _committed_table(sink: str) -> pa.Table:
    import ray

    return pa.concat_tables(ray.get(read_dataset(sink).to_arrow_refs())).sort_by("id")


def test_one_bad_csv_line_keeps_the_other_rows(ray_cluster, local_dir):
    lines = ["id,name,score"] + [f"{i},n{i},{i * 10}" for i in range(1000)]
    lines[501] = "500,n500"                         # too few fields
    lines[801] = "800,n800,8000,surplus"            # too many fields
    put_bytes(f"{local_dir}/raw/a.csv", ("\n".join(lines) + "\n").encode())
    report = Pipeline(_spec(local_dir, "csv", on_error="quarantine")).run()
    assert (report.rows_read, report.rows_written, report.rows_quarantined) == (1000, 998, 2)
    ids = sorted(read_dataset(f"{local_dir}/out").to_pandas()["id"].tolist())
    assert ids == [i for i in range(1000) if i not in (500, 800)]
    recs = _quarantined(f"{local_dir}/out")
    assert sorted(r["_sf_raw"] for r in recs) == [b"500,n500", b"800,n800,8000,surplus"]
    assert sorted(r["_sf_row"] for r in recs) == [500, 800]
    assert all("a.csv" in r["_sf_error"] and "line" in r["_sf_error"] for r in recs)


def test_one_type_changing_jsonl_value_keeps_the_other_rows(ray_cluster, local_dir):
    rows = [json.dumps({"id": i, "text": f"t{i}"}) for i in range(1000)]
    rows[700] = json.dumps({"id": "seven hundred", "text": "t700"})
    put_bytes(f"{local_dir}/raw/a.jsonl", ("\n".join(rows) + "\n").encode())
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine")).run()
    assert (report.rows_read, report.rows_written, report.rows_quarantined) == (1000, 999, 1)
    (rec,) = _quarantined(f"{local_dir}/out")
    assert rec["_sf_row"] == 700 and rec["_sf_raw"] == rows[700].encode()
    assert "line 701" in rec["_sf_error"]
    # The budget sees per-record counts: 1 of 1000 is within 1%, 2 are not.
    rows[100] = json.dumps({"id": [1], "text": "t100"})
    put_bytes(f"{local_dir}/raw/a.jsonl", ("\n".join(rows) + "\n").encode())
    with pytest.raises(Exception, match=r"2 of 1000 rows were bad"):
        Pipeline(_spec(local_dir, "jsonl", on_error="skip", max_error_fraction=0.001)).run(overwrite=True)


def test_unreadable_parquet_file_exceeds_any_budget(ray_cluster, local_dir):
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(10))}), buf)
    put_bytes(f"{local_dir}/raw/a.parquet", buf.getvalue().to_pybytes())
    put_bytes(f"{local_dir}/raw/b.parquet", b"PAR1 not really parquet")  # row count unknown
    with pytest.raises(Exception, match=r"b\.parquet.* row count is unknown"):
        Pipeline(_spec(local_dir, "parquet", on_error="skip", max_error_fraction=1.0)).run()
    assert not is_committed(f"{local_dir}/out")


def test_parquet_int96_timestamps_arrive_as_written(ray_cluster, local_dir):
    """Spark, Hive and Impala write timestamps as Parquet INT96; pyarrow reads
    them at nanoseconds, whose range ends in 2262, so the warehouse sentinel
    9999-12-31 arrived as 1816-03-29 05:56:08 with the run green. INT96 is
    read at microseconds (Spark's precision): every value arrives as written.
    A file whose INT96 values hold nanoseconds, which microseconds would drop,
    is refused naming the file and column. `validate` shows the same type."""
    import datetime

    ts = [datetime.datetime(9999, 12, 31), datetime.datetime(2020, 1, 1, 0, 0, 0, 123456),
          datetime.datetime(1, 1, 1), None]
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "ts": pa.array(ts, pa.timestamp("us")),
                             "nested": pa.array([[t] for t in ts], pa.list_(pa.timestamp("us")))}),
                   buf, use_deprecated_int96_timestamps=True)
    put_bytes(f"{local_dir}/raw/a.parquet", buf.getvalue().to_pybytes())
    Pipeline(_spec(local_dir, "parquet", on_error="fail")).run()
    got = _committed_table(f"{local_dir}/out")
    assert got.schema.field("ts").type == pa.timestamp("us")
    assert got.column("ts").to_pylist() == ts
    assert got.column("nested").to_pylist() == [[t] for t in ts]
    with open(f"{local_dir}/spec.json", "w") as f:
        json.dump(_spec(local_dir, "parquet", on_error="fail"), f)
    out = _slicefeed("validate", f"{local_dir}/spec.json")
    assert out.returncode == 0, out.stderr
    assert "ts: timestamp[us]" in out.stdout, out.stdout

    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [5, 6], "at": pa.array([1_000, 1_577_836_800_000_000_001],
                                                           pa.timestamp("ns"))}),
                   buf, use_deprecated_int96_timestamps=True)
    put_bytes(f"{local_dir}/raw/b.parquet", buf.getvalue().to_pybytes())
    with pytest.raises(Exception, match=r"b\.parquet.*'at'.*row 1.*nanoseconds") as e:
        Pipeline(_spec(local_dir, "parquet", on_error="skip", max_error_fraction=1.0)).run(
            overwrite=True)
    assert "1577836800000000001" not in str(e.value)


# -- reserved column names -------------------------------------------------------


@pytest.mark.parametrize("fmt, column", [("jsonl", "_sf_error"), ("jsonl", "_sf_row"),
                                         ("csv", "_sf_file"), ("jsonl", "_sf_raw")])
@pytest.mark.slow
def test_reserved_columns_in_input_are_refused(ray_cluster, local_dir, fmt, column):
    good = [{"id": i, "text": "fine"} for i in range(5)]
    forged = [dict(r, **{column: "forged\nFAKE: all rows committed"}) for r in good]

    def put(name, rows):
        if fmt == "jsonl":
            put_bytes(f"{local_dir}/raw/{name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        else:
            head = list(rows[0])
            body = "".join(",".join(json.dumps(r[c]) for c in head) + "\n" for r in rows)
            put_bytes(f"{local_dir}/raw/{name}.csv", (",".join(head) + "\n" + body).encode())

    # A later file forges the column: the run fails naming file and column.
    put("a", good)
    put("b", forged)
    with pytest.raises(SpecError, match=rf"b\.{fmt}: column '{column}' is reserved"):
        Pipeline(_spec(local_dir, fmt, on_error="skip", max_error_fraction=1.0)).run()
    assert not is_committed(f"{local_dir}/out")
    # The first file forges it: `validate` refuses (exit 2).
    put("a", forged)
    spec_path = os.path.join(local_dir, "s.json")
    with open(spec_path, "w") as f:
        json.dump(_spec(local_dir, fmt, on_error="fail"), f)
    r = _slicefeed("validate", spec_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"column '{column}' is reserved" in r.stderr
    # Leaving it out with `columns:` is the documented way round.
    spec = _spec(local_dir, fmt, on_error="fail")
    spec["source"]["options"] = {"columns": ["id", "text"]}
    assert Pipeline(spec).run().rows_written == 10


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.slow
def test_invalid_utf8_is_a_bad_record_never_committed(ray_cluster, local_dir, fmt):
    """pyarrow's JSON reader keeps invalid UTF-8 in a string column (committed, it
    broke every reader of the dataset), and its CSV reader turns the whole column
    into binary: the record is a bad record, the other rows keep their types."""
    from slicefeed.connectors import BadRecordError

    texts = [f"t{i}" for i in range(20)]
    if fmt == "jsonl":
        body = b"".join(b'{"id": %d, "text": "t%d"}\n' % (i, i) for i in range(20))
        body = body.replace(b'"t7"', b'"t\xff\xfe7"')
        where = r"line 8 \(row 7\)"
        raw = b'{"id": 7, "text": "t\xff\xfe7"}'
    else:
        body = b"id,text\n" + b"".join(b"%d,t%d\n" % (i, i) for i in range(20))
        body = body.replace(b",t7\n", b",t\xff\xfe7\n")
        # A quoted line break before it: records are not lines.
        body = body.replace(b",t3\n", b',"t\n3"\n')
        texts[3] = "t\n3"
        where = r"row 7: column 'text' is not valid UTF-8"
        raw = b"7,t\xff\xfe7"
    put_bytes(f"{local_dir}/raw/a.{fmt}", body)
    with pytest.raises(BadRecordError, match=rf"a\.{fmt}: {where}"):
        Pipeline(_spec(local_dir, fmt, on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")
    report = Pipeline(_spec(local_dir, fmt, on_error="quarantine", max_error_fraction=0.1)).run()
    assert (report.rows_written, report.rows_quarantined) == (19, 1)
    rows = read_dataset(f"{local_dir}/out").take_all()
    assert sorted(r["text"] for r in rows) == sorted(t for i, t in enumerate(texts) if i != 7)
    recs = _quarantined(f"{local_dir}/out")
    # The quarantine keeps the whole record, as written (not only the bad value).
    assert len(recs) == 1 and recs[0]["_sf_row"] == 7 and recs[0]["_sf_raw"] == raw


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.slow
def test_integer_float64_would_round_is_a_bad_record(ray_cluster, local_dir, fmt):
    """pyarrow types a JSON or CSV column holding integers next to fractions (or
    an integer beyond int64) as float64, and 9007199254740993 arrived as
    9007199254740992 with the run green. Now that record is a bad record naming
    the file, row and column; every other value arrives exactly, exact large
    integers and float literals such as 1e23 included."""
    from slicefeed.connectors import BadRecordError

    ids = [2**62 + i for i in range(20)]
    if fmt == "jsonl":
        body = b"".join(b'{"id": %d, "score": %d.5, "big": 1e23}\n' % (v, i) for i, v in enumerate(ids))
        body = body.replace(b'"score": 7.5', b'"score": 9007199254740993')
        where = r"line 8 \(row 7\): column 'score' holds the integer 9007199254740993"
    else:
        body = b"id,score,big\n" + b"".join(b"%d,%d.5,1e23\n" % (v, i) for i, v in enumerate(ids))
        body = body.replace(b",7.5,", b",9007199254740993,")
        where = r"row 7: column 'score' holds the integer 9007199254740993"
    put_bytes(f"{local_dir}/raw/a.{fmt}", body)
    with pytest.raises(BadRecordError, match=rf"a\.{fmt}: {where}, which float64 would round"):
        Pipeline(_spec(local_dir, fmt, on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")
    report = Pipeline(_spec(local_dir, fmt, on_error="quarantine", max_error_fraction=0.1)).run()
    assert (report.rows_written, report.rows_quarantined) == (19, 1)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [v for i, v in enumerate(ids) if i != 7]
    assert [r["score"] for r in rows] == [i + 0.5 for i in range(20) if i != 7]
    assert {r["big"] for r in rows} == {1e23}
    recs = _quarantined(f"{local_dir}/out")
    assert len(recs) == 1 and recs[0]["_sf_row"] == 7 and b"9007199254740993" in recs[0]["_sf_raw"]


@pytest.mark.slow
def test_csv_number_beyond_float64_is_a_bad_record(ray_cluster, local_dir):
    """pyarrow's CSV reader makes 1e400 infinite: it was committed as inf with
    the run green. Now it is a bad record naming the row and column; `inf` and
    `-Infinity` as written, and the largest finite float64, arrive as written."""
    from slicefeed.connectors import BadRecordError

    values = ["1.5", "inf", "-Infinity", "1.7976931348623157e308", "2.5"] * 4
    values[13] = "-1E400"
    body = "id,x\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values))
    put_bytes(f"{local_dir}/raw/a.csv", body.encode())
    with pytest.raises(BadRecordError, match=r"a\.csv: row 13: column 'x' holds -1E400, beyond the "
                                             r"range of float64"):
        Pipeline(_spec(local_dir, "csv", on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")
    report = Pipeline(_spec(local_dir, "csv", on_error="quarantine", max_error_fraction=0.1)).run()
    assert (report.rows_written, report.rows_quarantined) == (19, 1)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["x"] for r in rows] == [float(v) for i, v in enumerate(values) if i != 13]
    (rec,) = _quarantined(f"{local_dir}/out")
    assert rec["_sf_row"] == 13 and rec["_sf_raw"] == b"13,-1E400"  # the record as written


@pytest.mark.slow
def test_csv_numbers_written_with_leading_zeros_or_a_sign_arrive_as_written(ray_cluster, local_dir):
    """pyarrow's CSV reader typed ``02139`` as the integer 2139,
    ``+15551234567`` as the float 15551234567.0 and ``0x1F`` as 31: the text
    was changed with the run green. A numeric column holding such a number
    arrives as the strings written (`cast` makes a number where one is
    wanted); other numeric columns keep their types. The same holds on the
    bad-record path and in the schema `validate` shows."""
    body = ("id,zip,phone,n,at,h\n"
            "1,02139,+15551234567,7,2024-01-01 00:00:00,0x1F\n"
            "2,10001,5551234,-08,2024-01-02 00:00:00,0xff\n"
            "3,00501,+4420,12,2024-01-03 00:00:00,10\n")
    put_bytes(f"{local_dir}/raw/a.csv", body.encode())
    Pipeline(_spec(local_dir, "csv", on_error="fail")).run()
    got = _committed_table(f"{local_dir}/out")
    assert got.schema.field("id").type == pa.int64()
    assert got.column("zip").to_pylist() == ["02139", "10001", "00501"]
    assert got.column("phone").to_pylist() == ["+15551234567", "5551234", "+4420"]
    assert got.column("n").to_pylist() == ["7", "-08", "12"]
    assert got.column("h").to_pylist() == ["0x1F", "0xff", "10"]
    # Times ("00:00:00") are not numbers written with a leading zero.
    assert pa.types.is_timestamp(got.schema.field("at").type)
    # The bad-record path reads the same values.
    put_bytes(f"{local_dir}/raw/a.csv", (body + "4,oops\n").encode())
    report = Pipeline(_spec(local_dir, "csv", on_error="quarantine", max_error_fraction=0.5)).run(
        overwrite=True)
    assert report.rows_quarantined == 1
    got = _committed_table(f"{local_dir}/out")
    assert got.column("zip").to_pylist() == ["02139", "10001", "00501"]
    put_bytes(f"{local_dir}/raw/a.csv", body.encode())
    with open(f"{local_dir}/spec.json", "w") as f:
        json.dump(_spec(local_dir, "csv", on_error="fail"), f)
    out = _slicefeed("validate", f"{local_dir}/spec.json")
    assert out.returncode == 0, out.stderr
    assert re.search(r"zip: string", out.stdout), out.stdout


def test_csv_nan_written_as_such_arrives_as_nan_not_null(ray_cluster, local_dir):
    """pyarrow's CSV reader counts ``NaN``, ``nan`` and ``-nan`` among its null
    spellings, so a float column's written NaN (a value, kept apart from a
    missing one in Arrow and Parquet) committed as null with the run green,
    while ``inf`` stayed inf. A NaN arrives as NaN (its sign kept); the
    missing-value spellings (empty, ``NA``, ``null``) stay null. The same holds
    on the bad-record path."""
    import numpy as np

    body = "id,x\n1,NaN\n2,nan\n3,-nan\n4,1.5\n5,\n6,NA\n7,null\n8,inf\n"
    for on_error, extra in (("fail", ""), ("quarantine", "9,oops,1\n")):
        put_bytes(f"{local_dir}/raw/a.csv", (body + extra).encode())
        Pipeline(_spec(local_dir, "csv", on_error=on_error, max_error_fraction=0.5)).run(
            overwrite=True)
        got = _committed_table(f"{local_dir}/out").sort_by("id")
        x = got.column("x")
        assert x.type == pa.float64(), on_error
        assert x.null_count == 3, (on_error, x.to_pylist())
        values = x.to_numpy(zero_copy_only=False)
        assert np.isnan(values[:3]).all() and values[3] == 1.5 and values[7] == np.inf
        assert list(np.signbit(values[:3])) == [False, False, True]
        assert x.is_null().to_pylist() == [False] * 4 + [True] * 3 + [False]


@pytest.mark.slow
def test_transform_meeting_a_later_files_type_names_file_and_columns(ray_cluster, local_dir):
    """`validate` types a CSV column from the first file; a later file whose
    `-08` keeps that column as text made `filter: n > 50` fail with pyarrow's
    raw "Function 'greater' has no kernel matching input types (string, int8)".
    The error names the transform, the file, the batch's column types and the fix."""
    from slicefeed.connectors import SpecError

    put_bytes(f"{local_dir}/raw/a.csv", b"id,n\n1,70\n2,20\n")
    put_bytes(f"{local_dir}/raw/b.csv", b"id,n\n3,-08\n4,99\n")
    spec = _spec(local_dir, "csv", on_error="fail",
                 transforms=[{"filter": {"expr": "n > 50"}}])
    with pytest.raises(SpecError, match=r"transform 'filter' cannot run on a batch from input "
                                        r"file\(s\) '[^']*b\.csv' whose columns are id: int64, "
                                        r"n: string .*add a `cast` transform"):
        Pipeline(spec).run()
    spec["transforms"].insert(0, {"cast": {"columns": {"n": "int64"}}})
    Pipeline(spec).run()
    got = _committed_table(f"{local_dir}/out")
    assert got.column("id").to_pylist() == [1, 4]


@pytest.mark.slow
def test_jsonl_number_beyond_float64_is_one_bad_record(ray_cluster, local_dir):
    """pyarrow refuses a JSON number beyond float64's range ("Number too big"):
    the run failed with "cannot be read as JSON lines", and under quarantine the
    record was blamed for not matching the types of earlier lines. It is a bad
    record saying what it holds."""
    from slicefeed.connectors import BadRecordError

    lines = [json.dumps({"id": i, "x": i + 0.5}).encode() for i in range(10)]
    lines[2] = b'{"id": 2, "x": -1E400}'
    put_bytes(f"{local_dir}/raw/a.jsonl", b"\n".join(lines) + b"\n")
    with pytest.raises(BadRecordError, match=r"a\.jsonl: line 3 \(row 2\) holds the number -1E400, "
                                             r"which pyarrow's JSON reader refuses \(an exponent"):
        Pipeline(_spec(local_dir, "jsonl", on_error="fail")).run()
    # pyarrow reads 1.8e308 as inf without an error: found all the same.
    put_bytes(f"{local_dir}/raw/b.jsonl", b'{"id": 10, "x": 1.8e308}\n{"id": 11, "x": 1.5}\n')
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine", max_error_fraction=0.2)).run()
    assert (report.rows_written, report.rows_quarantined) == (10, 2)
    a, b = sorted(_quarantined(f"{local_dir}/out"), key=lambda r: r["_sf_error"])
    assert a["_sf_raw"] == lines[2] and "line 3 holds the number -1E400" in a["_sf_error"]
    assert b["_sf_row"] == 0 and "b.jsonl: line 1 holds the number 1.8e308, beyond the range" in b["_sf_error"]


def test_jsonl_constants_pyarrow_reads_are_kept_on_the_bad_record_path(ray_cluster, local_dir):
    """pyarrow reads `Inf`, `-Inf` and `-NaN`, which Python's parser does not.
    A file without bad records kept them, but once a file held one bad record
    its walk called every such record "not valid JSON": under `fail` the error
    named the wrong line, under `quarantine` good records were quarantined.
    And a record holding both such a constant and a number made infinite
    failed its whole file as "cannot be checked"."""
    from slicefeed.connectors import BadRecordError

    lines = [b'{"id": %d, "x": %s, "y": 0.5}' % (i, c)
             for i, c in enumerate([b"Inf", b"-Inf", b"-NaN", b"1.5", b"Infinity"] * 2)]
    lines[7] = b'{"id": 7, "x": "seven", "y": 0.5}'
    put_bytes(f"{local_dir}/raw/a.jsonl", b"\n".join(lines) + b"\n")
    put_bytes(f"{local_dir}/raw/b.jsonl", b'{"id": 10, "x": 1.8e308, "y": Inf}\n'
                                          b'{"id": 11, "x": 2.5, "y": -NaN}\n')
    with pytest.raises(BadRecordError, match=r"a\.jsonl: line 8 \(row 7\) does not match the "
                                             r"types of earlier lines") as e:
        Pipeline(_spec(local_dir, "jsonl", on_error="fail")).run()
    assert "in row" not in str(e.value)  # pyarrow's row: of the one line it read
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine", max_error_fraction=0.2)).run()
    assert (report.rows_written, report.rows_quarantined) == (10, 2)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4, 5, 6, 8, 9, 11]
    assert [r["x"] for r in rows[:2]] == [float("inf"), float("-inf")]
    a, b = sorted(_quarantined(f"{local_dir}/out"), key=lambda r: r["_sf_error"])
    assert a["_sf_row"] == 7 and "a.jsonl: line 8 does not match" in a["_sf_error"]
    assert b["_sf_row"] == 0 and "b.jsonl: line 1 holds the number 1.8e308" in b["_sf_error"]


@pytest.mark.slow
def test_jsonl_strings_that_look_like_times_arrive_as_written(ray_cluster, local_dir):
    """pyarrow's JSON reader typed strings that look like times as timestamps:
    "2024-01-01" arrived as midnight and "2024-01-01T10:00:00+05:00" as a naive
    05:00, the offset lost. JSON strings arrive as the strings they are, nested
    ones included; `cast` makes a timestamp where one is wanted."""
    rows = [{"id": i, "day": f"2024-01-{i + 1:02d}", "at": f"2024-01-01T10:00:0{i}+05:00",
             "n": {"seen": [f"2024-02-0{i + 1} 08:30:00"]}} for i in range(3)]
    put_bytes(f"{local_dir}/raw/a.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    spec = _spec(local_dir, "jsonl", on_error="fail",
                 transforms=[{"cast": {"columns": {"id": "int64"}}}])
    Pipeline(spec).run()
    got = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert got == rows
    spec["transforms"] = [{"cast": {"columns": {"day": "timestamp[s]"}}}]
    Pipeline(spec).run(overwrite=True)
    import datetime

    got = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["day"] for r in got] == [datetime.datetime(2024, 1, i + 1) for i in range(3)]


@pytest.mark.slow
def test_jsonl_null_record_is_a_bad_record(ray_cluster, local_dir):
    """A line holding JSON `null` was committed as a row of nulls with the run
    green, and as the first line of a file it crashed the reading worker
    (pyarrow's JSON reader segfaults on it). Both are bad records naming the
    line; `null` as a value, or inside a string after a `}`, is data."""
    from slicefeed.connectors import BadRecordError

    lines = [json.dumps({"id": i, "note": None if i % 2 else f"x}} null {i}"}).encode()
             for i in range(20)]
    lines[5] = b"  null "
    put_bytes(f"{local_dir}/raw/a.jsonl", b"\n".join(lines) + b"\n")
    put_bytes(f"{local_dir}/raw/b.jsonl", b"null\r\n" + json.dumps({"id": 20, "note": "y"}).encode())
    with pytest.raises(BadRecordError, match=r"a\.jsonl: line 6 \(row 5\) is JSON null, "
                                             r"expected an object"):
        Pipeline(_spec(local_dir, "jsonl", on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine", max_error_fraction=0.2)).run()
    assert (report.rows_written, report.rows_quarantined) == (20, 2)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [i for i in range(21) if i != 5]
    assert rows[0]["note"] == "x} null 0" and rows[1]["note"] is None
    recs = sorted(_quarantined(f"{local_dir}/out"), key=lambda r: r["_sf_error"])
    assert [(r["_sf_row"], r["_sf_raw"]) for r in recs] == [(5, b"null"), (0, b"null")]
    assert "a.jsonl: line 6 is JSON null" in recs[0]["_sf_error"]
    assert "b.jsonl: line 1 is JSON null" in recs[1]["_sf_error"]


@pytest.mark.slow
def test_jsonl_record_longer_than_a_mib_is_read(ray_cluster, local_dir):
    """pyarrow's JSON reader refuses a record longer than its 1 MiB block
    ("straddles two block boundaries"): a valid file failed the run under
    `fail`, and its long record was quarantined under `quarantine`."""
    lines = [json.dumps({"id": i, "text": "x" * ((3 << 20) if i == 2 else 10)}).encode()
             for i in range(5)]
    put_bytes(f"{local_dir}/raw/a.jsonl", b"\n".join(lines) + b"\n")
    for on_error in ("fail", "quarantine"):
        report = Pipeline(_spec(local_dir, "jsonl", on_error=on_error)).run(overwrite=True)
        assert (report.rows_written, report.rows_quarantined) == (5, 0)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [len(r["text"]) for r in rows] == [10, 10, 3 << 20, 10, 10]


@pytest.mark.slow
def test_jsonl_value_nested_too_deep_is_a_bad_record(ray_cluster, local_dir):
    """A value 40 levels deep was committed as a dataset no Parquet reader could
    open ("schema too deeply nested"); 5000 levels failed the run at commit with
    a bare "Invalid flatbuffers message". Both are bad records naming the line."""
    from slicefeed.connectors import BadRecordError

    lines = [json.dumps({"id": i, "n": [[i]]}).encode() for i in range(20)]
    lines[3] = b'{"id": 3, "n": ' + b"[" * 40 + b"]" * 40 + b"}"
    lines[9] = b'{"id": 9, "n": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    put_bytes(f"{local_dir}/raw/a.jsonl", b"\n".join(lines) + b"\n")
    with pytest.raises(BadRecordError, match=r"a\.jsonl: line 4 \(row 3\) holds column 'n' nested "
                                             r"40 levels deep; at most 32 levels"):
        Pipeline(_spec(local_dir, "jsonl", on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine", max_error_fraction=0.2)).run()
    assert (report.rows_written, report.rows_quarantined) == (18, 2)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [(r["id"], r["n"]) for r in rows] == [(i, [[i]]) for i in range(20) if i not in (3, 9)]
    recs = sorted(_quarantined(f"{local_dir}/out"), key=lambda r: r["_sf_row"])
    assert [r["_sf_row"] for r in recs] == [3, 9]
    assert "nested too deep" in recs[1]["_sf_error"]


@pytest.mark.slow
def test_jsonl_key_written_twice_on_the_first_line_is_one_bad_record(ray_cluster, local_dir):
    """pyarrow refuses an object that writes a key twice. On the first line (the
    one the schema is peeked from) it failed the whole run under quarantine, with
    advice to set the quarantine already set; it is one bad record like anywhere
    else, and under `fail` the error names its line."""
    from slicefeed.connectors import BadRecordError

    put_bytes(f"{local_dir}/raw/a.jsonl",
              b'{"id": 1, "t": "a", "id": 7}\n{"id": 2, "t": "b"}\n{"id": 3, "t": "c"}\n')
    with pytest.raises(BadRecordError, match=r"a\.jsonl: line 1 \(row 0\) writes the key 'id' twice"):
        Pipeline(_spec(local_dir, "jsonl", on_error="fail")).run()
    report = Pipeline(_spec(local_dir, "jsonl", on_error="quarantine", max_error_fraction=0.5)).run()
    assert (report.rows_written, report.rows_quarantined) == (2, 1)
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [(r["id"], r["t"]) for r in rows] == [(2, "b"), (3, "c")]


def test_source_folder_named_with_glob_characters_is_read_as_written(ray_cluster, local_dir):
    """A folder named ``in ?x`` was taken as a glob whose matches are folders,
    so the run said no file matched; a path that exists is read as written, and
    a sink beside it is not taken for one of its matches."""
    src = os.path.join(local_dir, "in ?x")
    put_bytes(os.path.join(src, "a[1].jsonl"), b'{"id": 1}\n{"id": 2}\n')
    spec = {"name": "glob-chars", "source": {"format": "jsonl", "uri": src + "/"},
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}
    report = Pipeline(spec).run()
    assert report.rows_written == 2
    assert sorted(r["id"] for r in read_dataset(f"{local_dir}/out").take_all()) == [1, 2]


def test_glob_matching_one_file_name_in_two_folders_counts_both(ray_cluster, local_dir):
    """`raw/*/events.jsonl` named both files by their base name: the run's
    counters took the second file's batches for the first's and dropped them
    (3 bad records uncounted, the run green under max_error_fraction 0), and
    one quarantine file overwrote the other."""
    from slicefeed.connectors import BadRecordError

    put_bytes(f"{local_dir}/raw/d1/events.jsonl", b'{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    put_bytes(f"{local_dir}/raw/d2/events.jsonl", b'{"id": oops}\n{"id": 5}\n{"id": oops}\n')
    spec = _spec(local_dir, "jsonl", on_error="skip", max_error_fraction=0.0)
    spec["source"]["uri"] = f"{local_dir}/raw/*/events.jsonl"
    with pytest.raises(BadRecordError, match=r"2 of 6 rows"):
        Pipeline(spec).run()
    report = Pipeline({**spec, "on_error": "quarantine", "max_error_fraction": 0.5}).run()
    assert (report.rows_read, report.rows_written, report.rows_quarantined) == (6, 4, 2)
    assert sorted(r["id"] for r in read_dataset(f"{local_dir}/out").take_all()) == [1, 2, 3, 5]
    recs = _quarantined(f"{local_dir}/out")
    assert sorted((r["_sf_file"], r["_sf_row"]) for r in recs) == [
        ("d2/events.jsonl", 0), ("d2/events.jsonl", 2)]


def test_folder_files_not_named_for_the_format_are_reported_not_listed(ray_cluster, local_dir):
    """A folder source reads the files named for its format. Others (a
    Hadoop-style `part-00001`, an upper-case `B.JSONL`) were left out without a
    word, yet counted in the report's files and bytes and listed in the
    manifest's inputs, so editing one later said an input had changed."""
    from slicefeed.connectors import read_manifest

    put_bytes(f"{local_dir}/raw/a.jsonl", b'{"id": 1}\n{"id": 2}\n')
    put_bytes(f"{local_dir}/raw/part-00001", b'{"id": 3}\n{"id": 4}\n')
    put_bytes(f"{local_dir}/raw/B.JSONL", b'{"id": 5}\n')
    report = Pipeline(_spec(local_dir, "jsonl")).run()
    assert report.rows_written == 2
    (src,) = report.sources
    assert (src["files"], src["files_left_out"], src["first_left_out"]) == (1, 2, "B.JSONL")
    assert "did not read 2 file(s) of" in report.summary() and "'B.JSONL'" in report.summary()
    assert [i.uri.rsplit("/", 1)[-1] for i in read_manifest(f"{local_dir}/out").inputs] == ["a.jsonl"]
    os.remove(f"{local_dir}/raw/a.jsonl")
    with pytest.raises(FileNotFoundError, match=r"No file in .*raw is named \*\.jsonl, \*\.json.*; "
                                                r"2 other file\(s\) are, such as 'B\.JSONL'"):
        Pipeline(_spec(local_dir, "jsonl")).run(overwrite=True)


def test_input_files_whose_types_differ_are_named_in_a_bounded_message(ray_cluster, local_dir):
    """Two CSV files typing one column int64 and double: the error named output
    shards rather than the input files, and quoted the column name whole (a
    200 kB name with a terminal escape came back as a 200 kB message)."""
    name = "c\x1b[31m" + "x" * 200_000
    put_bytes(f"{local_dir}/raw/a.csv", f"id,{name}\n1,1\n".encode())
    put_bytes(f"{local_dir}/raw/b.csv", f"id,{name}\n2,1.5\n".encode())
    with pytest.raises(ValueError) as e:
        Pipeline(_spec(local_dir, "csv", on_error="fail")).run()
    msg = str(e.value)
    assert len(msg) < 1000 and "\x1b" not in msg, msg[:300]
    assert re.search(r"the rows of input file .*raw/[ab]\.csv and of input file .*raw/[ab]\.csv "
                     r"have different types \('c\\x1b\[31mxxx.*': (int64 vs double|double vs int64)",
                     msg), msg


def test_input_files_differing_by_a_column_are_told_apart_and_by_nulls_allowed_agree(
        ray_cluster, local_dir):
    """A column only the first file has was reported as "the same columns in
    another order". Parquet files of two writers, one declaring a column not
    null, were refused until a cast: a not-null column is a nullable one
    without nulls, so they commit as one nullable column, values unchanged."""
    put_bytes(f"{local_dir}/raw/a.csv", b"id,zip,extra\n1,10001,5\n")
    put_bytes(f"{local_dir}/raw/b.csv", b"id,zip\n2,10002\n")
    with pytest.raises(ValueError) as e:
        Pipeline(_spec(local_dir, "csv", on_error="fail")).run()
    assert re.search(r"different types \('extra': (int64 vs missing|missing vs int64)\)\. "
                     r"Keep the columns every batch has", str(e.value)), str(e.value)
    base = f"{local_dir}/parquet"
    os.makedirs(f"{base}/raw")
    required = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int64(), nullable=False)])
    pq.write_table(pa.table({"id": [1], "v": [7]}, schema=required), f"{base}/raw/a.parquet")
    pq.write_table(pa.table({"id": [2], "v": [None]}, schema=pa.schema(
        [pa.field("id", pa.int64()), pa.field("v", pa.int64())])), f"{base}/raw/b.parquet")
    assert Pipeline(_spec(base, "parquet", on_error="fail")).run().rows_written == 2
    assert read_manifest(f"{base}/out").schema == pa.schema([("id", pa.int64()), ("v", pa.int64())])
    assert sorted(read_dataset(f"{base}/out").take_all(), key=lambda r: r["id"]) == [
        {"id": 1, "v": 7}, {"id": 2, "v": None}]
    # Files that all declare it not null keep that declaration.
    both = f"{local_dir}/required"
    os.makedirs(f"{both}/raw")
    for i in (1, 2):
        pq.write_table(pa.table({"id": [i], "v": [7 * i]}, schema=required), f"{both}/raw/{i}.parquet")
    assert Pipeline(_spec(both, "parquet", on_error="fail")).run().rows_written == 2
    assert read_manifest(f"{both}/out").schema == required


@pytest.mark.slow
def test_csv_quote_never_closed_fails_instead_of_swallowing_rows(ray_cluster, local_dir):
    """pyarrow reads everything after a quote that never closes as one value:
    the records after it vanished and the run committed. Now the file fails,
    naming the line; a quote inside an unquoted value is still a character."""
    from slicefeed.connectors import BadRecordError

    put_bytes(f"{local_dir}/raw/a.csv", b'id,text\n0,5" screen\n1,"abc\n2,b\n3,c\n')
    for on_error in ("fail", "quarantine"):
        with pytest.raises(BadRecordError, match=r"a\.csv: line 3 opens a quoted value that is "
                                                 r"never closed"):
            Pipeline(_spec(local_dir, "csv", on_error=on_error, max_error_fraction=1.0)).run()
    assert not is_committed(f"{local_dir}/out")
    put_bytes(f"{local_dir}/raw/a.csv", b'id,text\n0,5" screen\n1,"a ""q""\nb"\n2,c\n')
    Pipeline(_spec(local_dir, "csv", on_error="fail")).run()
    rows = sorted(read_dataset(f"{local_dir}/out").take_all(), key=lambda r: r["id"])
    assert [r["text"] for r in rows] == ['5" screen', 'a "q"\nb', "c"]


def test_csv_header_naming_a_column_twice_is_refused(ray_cluster, local_dir):
    """Two columns of one name were committed side by side, and readers of the
    dataset then failed ("Multiple matches") or dropped one."""
    put_bytes(f"{local_dir}/raw/a.csv", b"id,text\n1,a\n")
    put_bytes(f"{local_dir}/raw/b.csv", b"id,id,text\n1,2,a\n3,4,b\n")
    with pytest.raises(SpecError, match=r"b\.csv: column 'id' appears twice"):
        Pipeline(_spec(local_dir, "csv", on_error="skip", max_error_fraction=1.0)).run()
    assert not is_committed(f"{local_dir}/out")
    os.remove(f"{local_dir}/raw/a.csv")  # the first file: `validate` refuses (exit 2)
    spec_path = os.path.join(local_dir, "s.json")
    with open(spec_path, "w") as f:
        json.dump(_spec(local_dir, "csv", on_error="fail"), f)
    r = _slicefeed("validate", spec_path)
    assert r.returncode == 2 and "column 'id' appears twice" in r.stderr, r.stderr[-2000:]


def test_validate_names_a_null_first_record_instead_of_crashing(local_dir):
    """`slicefeed validate` peeks the first file's schema with pyarrow, which
    segfaulted on a first record `null` (exit -11, no message)."""
    put_bytes(f"{local_dir}/raw/a.jsonl", b'null\n{"id": 1}\n')
    spec_path = os.path.join(local_dir, "s.json")
    with open(spec_path, "w") as f:
        json.dump(_spec(local_dir, "jsonl", on_error="fail"), f)
    r = _slicefeed("validate", spec_path)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "a.jsonl: line 1 (row 0) is JSON null, expected an object" in r.stderr


def test_jsonl_first_line_longer_than_the_schema_peek_is_read(local_dir):
    """The schema is peeked from the first MiB of the first file; a first line
    longer than that is read to its end instead of refused as invalid JSON."""
    long = json.dumps({"id": 0, "text": "x" * (3 << 20)})
    put_bytes(f"{local_dir}/raw/a.jsonl", (long + "\n" + json.dumps({"id": 1, "text": "y"}) + "\n").encode())
    spec_path = os.path.join(local_dir, "s.json")
    with open(spec_path, "w") as f:
        json.dump(_spec(local_dir, "jsonl", on_error="fail"), f)
    r = _slicefeed("validate", spec_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "text: string" in r.stdout, r.stdout[-2000:]


def test_messages_escape_control_characters_from_data(local_dir):
    put_bytes(f"{local_dir}/raw/a.csv", b'id,"evil\nFAKE: validated ok\x1b[2J"\n1,2\n')
    spec_path = os.path.join(local_dir, "s.json")
    with open(spec_path, "w") as f:
        json.dump(_spec(local_dir, "csv", transforms=[{"select": {"columns": ["nope"]}}]), f)
    r = _slicefeed("validate", spec_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "column 'nope' not found" in r.stderr
    assert "\nFAKE" not in r.stderr and "\x1b" not in r.stderr
    assert "evil\\nFAKE" in r.stderr
