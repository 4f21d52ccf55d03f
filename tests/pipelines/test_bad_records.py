"""Bad records under each policy (fail | skip | quarantine), with counts that add up.

Kinds: corrupt / truncated Parquet files, invalid and truncated JSONL lines,
a JSON line that is not an object, values of the wrong type (``cast``),
non-UTF-8 text lines, and (once those transforms exist) nulls in a required
column (``tokenize``) and undecodable images (``decode_image``).

A file that cannot be read at all (its row count is unknown) fails the run
whatever ``max_error_fraction`` says; every other bad record is one row. In
every run ``rows_read == rows_written + rows_filtered + rows_skipped + rows_quarantined``.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import is_committed, read_dataset, resolve_filesystem
from slicefeed.pipelines import Pipeline
from tests._harness import put_bytes

pytestmark = pytest.mark.timeout(240)




def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _parquet_corpus(base: str) -> dict:
    for f in range(3):
        put_bytes(f"{base}/raw/g{f}.parquet", _parquet_bytes(pa.table({
            "id": pa.array(range(f * 10, f * 10 + 10), pa.int64()),
            "text": [f"row {i}" for i in range(10)],
        })))
    good = _parquet_bytes(pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"]}))
    # Named to sort last: the schema check reads the first file.
    put_bytes(f"{base}/raw/zz-garbage.parquet", b"this is not parquet at all")
    put_bytes(f"{base}/raw/zz-truncated.parquet", good[: len(good) // 2])
    return {
        "source": {"format": "parquet", "uri": f"{base}/raw"},
        "transforms": [{"select": {"columns": ["id", "text"]}}],
        "read": 32, "written": 30, "bad": 2,
        "bad_files": {"zz-garbage.parquet", "zz-truncated.parquet"},
        "reasons": ["not a readable Parquet file"],
        "unreadable": True,
    }


def _jsonl_corpus(base: str) -> dict:
    good = [json.dumps({"id": i, "score": str(i), "text": f"t{i}"}) for i in range(10)]
    put_bytes(f"{base}/raw/a.jsonl", ("\n".join(good) + "\n").encode())
    put_bytes(f"{base}/raw/b.jsonl", (
        b'{"id": 10, "score": "1", "text": "ok"}\n'
        b'{"id": 11, "score": "2", "te\n'                    # truncated line
        b'[1, 2, 3]\n'                                         # not an object
        b'{"id": 13, "score": "seven", "text": "x"}\n'        # wrong type for cast
        b'\n'
        b'{"id": 14, "score": "4", "text": "fine"}\n'
    ))
    return {
        "source": {"format": "jsonl", "uri": f"{base}/raw"},
        "transforms": [{"cast": {"columns": {"id": "int32", "score": "int32"}}}],
        "read": 15, "written": 12, "bad": 3,
        "bad_files": {"b.jsonl"},
        "reasons": ["line 2 is not valid JSON", "line 3 is JSON array, expected an object",
                    "Cast: value in column 'score' cannot be cast to int32"],
        "raw": {b'{"id": 11, "score": "2", "te', b"[1, 2, 3]"},
    }


def _text_corpus(base: str) -> dict:
    put_bytes(f"{base}/raw/t1.txt", b"hello\nworld\n")
    put_bytes(f"{base}/raw/t2.txt", b"ok\n\xff\xfe broken \xc3\n fine\r\nlast")
    return {
        "source": {"format": "text", "uri": f"{base}/raw"},
        "transforms": [],
        "read": 6, "written": 5, "bad": 1,
        "bad_files": {"t2.txt"},
        "reasons": ["line 2 is not valid UTF-8"],
        "raw": {b"\xff\xfe broken \xc3"},
    }


CORPORA = {"parquet": _parquet_corpus, "jsonl": _jsonl_corpus, "text": _text_corpus}


def _spec(base: str, corpus: dict, **kw) -> dict:
    spec = {
        "name": "bad-records",
        "source": corpus["source"],
        "transforms": corpus["transforms"],
        "sink": {"format": "parquet", "uri": f"{base}/out"},
        "max_error_fraction": 0.5,
    }
    spec.update(kw)
    return spec


def _quarantined(sink: str, version: int | None = None) -> list[dict]:
    """The quarantined records of the run that committed ``version`` (default current)."""
    from slicefeed.connectors import read_manifest

    m = read_manifest(sink, version=version)
    if m.quarantine is None:
        return []
    q = resolve_filesystem(f"{sink}/{m.quarantine}")
    if not q.fs.exists(q.path):
        return []
    rows = []
    for p in sorted(q.fs.find(q.path)):
        with q.fs.open(p, "rb") as f:
            rows += pq.read_table(f).to_pylist()
    return rows


def _assert_adds_up(report, corpus) -> None:
    assert report.rows_read == corpus["read"]
    assert report.rows_written == corpus["written"]
    assert (report.rows_written + report.rows_filtered + report.rows_skipped
            + report.rows_quarantined) == report.rows_read
    # The report on disk says the same.
    r = resolve_filesystem(f"{report.sink}/_report.json")
    doc = json.loads(r.fs.cat_file(r.path))
    assert {k: doc[k] for k in ("rows_read", "rows_written", "rows_skipped", "rows_quarantined",
                                "rows_filtered")} == {
        "rows_read": report.rows_read, "rows_written": report.rows_written,
        "rows_skipped": report.rows_skipped, "rows_quarantined": report.rows_quarantined,
        "rows_filtered": report.rows_filtered}
    # Per source: files and input bytes; rows read is the same count.
    (src,) = doc["sources"]
    assert src["rows_read"] == report.rows_read
    raw = resolve_filesystem(src["uri"])
    assert src["bytes"] == doc["bytes_read"] == sum(raw.fs.size(p) for p in raw.fs.find(raw.path))
    assert src["files"] == len(raw.fs.find(raw.path))
    assert doc["fingerprint"] and doc["versions"]["ray"] and doc["wall_s"] > 0


def _fails_as_unreadable(local_dir: str, corpus: dict, policy: str) -> bool:
    """Files whose row count is unknown fail the run even with a generous budget."""
    if not corpus.get("unreadable"):
        return False
    with pytest.raises(Exception, match=r"2 input file\(s\) could not be read at all "
                                        r"\('zz-garbage\.parquet', 'zz-truncated\.parquet'\): "
                                        r"their row count is unknown"):
        Pipeline(_spec(local_dir, corpus, on_error=policy, max_error_fraction=1.0)).run()
    assert not is_committed(f"{local_dir}/out")
    return True


@pytest.mark.parametrize("kind", sorted(CORPORA))
@pytest.mark.slow
def test_skip_counts_bad_records(ray_cluster, local_dir, kind):
    corpus = CORPORA[kind](local_dir)
    if _fails_as_unreadable(local_dir, corpus, "skip"):
        return
    report = Pipeline(_spec(local_dir, corpus, on_error="skip")).run()
    _assert_adds_up(report, corpus)
    assert report.rows_skipped == corpus["bad"] and report.rows_quarantined == 0
    assert read_dataset(f"{local_dir}/out").count() == corpus["written"]
    assert _quarantined(f"{local_dir}/out") == []


@pytest.mark.parametrize("kind", sorted(CORPORA))
@pytest.mark.slow
def test_quarantine_writes_each_bad_record(ray_cluster, local_dir, kind):
    corpus = CORPORA[kind](local_dir)
    if _fails_as_unreadable(local_dir, corpus, "quarantine"):
        return
    report = Pipeline(_spec(local_dir, corpus, on_error="quarantine")).run()
    _assert_adds_up(report, corpus)
    assert report.rows_quarantined == corpus["bad"] and report.rows_skipped == 0
    recs = _quarantined(f"{local_dir}/out")
    assert len(recs) == corpus["bad"]
    assert {r["_sf_file"] for r in recs} == corpus["bad_files"]
    for reason in corpus["reasons"]:
        assert any(reason in r["_sf_error"] for r in recs), (reason, recs)
    for r in recs:
        if r["transform"] == "read" and kind != "parquet":
            assert isinstance(r["_sf_row"], int)  # the record's row within its file
    if "raw" in corpus:
        assert {r["_sf_raw"] for r in recs if r.get("_sf_raw") is not None} == corpus["raw"]
    # A rerun of the committed job is a no-op; the quarantine is unchanged.
    again = Pipeline(_spec(local_dir, corpus, on_error="quarantine")).run()
    assert again.status == "already_committed"
    assert len(_quarantined(f"{local_dir}/out")) == corpus["bad"]


@pytest.mark.parametrize(
    "kind, match",
    [
        # Two corrupt files are read in parallel: whichever fails first is named.
        ("parquet", r"zz-(garbage|truncated)\.parquet is not a readable Parquet file"),
        ("jsonl", r"b\.jsonl: line 2 \(row 1\) is not valid JSON"),
        ("text", r"t2\.txt: line 2 \(row 1\) is not valid UTF-8"),
    ],
)
def test_fail_names_file_and_row(ray_cluster, local_dir, kind, match):
    corpus = CORPORA[kind](local_dir)
    with pytest.raises(Exception, match=match):
        Pipeline(_spec(local_dir, corpus, on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")


def test_wrong_type_fail_names_file_and_row(ray_cluster, local_dir):
    corpus = _jsonl_corpus(local_dir)
    # Only the wrong-type record is left as a problem for `fail` to find.
    put_bytes(f"{local_dir}/raw/b.jsonl", b'{"id": 13, "score": "seven", "text": "x"}\n')
    with pytest.raises(Exception, match=r"file 'b\.jsonl' row 0: Cast: value in column 'score'"):
        Pipeline(_spec(local_dir, corpus, on_error="fail")).run()
    assert not is_committed(f"{local_dir}/out")


def test_reader_errors_count_towards_max_error_fraction(ray_cluster, local_dir):
    corpus = _jsonl_corpus(local_dir)  # 3 bad of 15 = 20%
    with pytest.raises(Exception, match=r"3 of 15 rows were bad \(20\.00%\), more than "
                                        r"max_error_fraction=0\.1"):
        Pipeline(_spec(local_dir, corpus, on_error="skip", max_error_fraction=0.1)).run()
    assert not is_committed(f"{local_dir}/out")


def _transform_or_skip(name: str) -> None:
    from slicefeed.connectors import SpecError
    from slicefeed.transforms import get_transform

    try:
        get_transform(name)
    except SpecError:
        pytest.skip(f"transform {name!r} not merged yet")


@pytest.mark.parametrize("policy", ["skip", "quarantine"])
def test_null_required_and_undecodable_images(ray_cluster, local_dir, policy):
    _transform_or_skip("tokenize")
    _transform_or_skip("decode_image")
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (4, 4), (255, 0, 0)).save(png, format="PNG")
    table = pa.table({
        "text": ["a", None, "c", "d", "e"],                               # row 1: null text
        "image": [png.getvalue(), png.getvalue(), b"\x89PNG garbage", png.getvalue(), None],
    })                                                                    # rows 2, 4: bad image
    put_bytes(f"{local_dir}/raw/img.parquet", _parquet_bytes(table))
    corpus = {"source": {"format": "parquet", "uri": f"{local_dir}/raw"},
              "transforms": [{"tokenize": {"column": "text"}}, {"decode_image": {"column": "image"}}],
              "read": 5, "written": 2, "bad": 3}
    report = Pipeline(_spec(local_dir, corpus, on_error=policy, max_error_fraction=0.9)).run()
    _assert_adds_up(report, corpus)
    assert report.rows_skipped + report.rows_quarantined == 3
    if policy == "quarantine":
        recs = _quarantined(f"{local_dir}/out")
        assert sorted((r["_sf_row"], r["transform"]) for r in recs) == [
            (1, "tokenize"), (2, "decode_image"), (4, "decode_image")]


@pytest.mark.parametrize("policy", ["skip", "quarantine"])
def test_bad_first_file_does_not_stop_the_schema_check(local_dir, policy):
    """Under skip/quarantine the up-front schema check passes over bad records too."""
    put_bytes(f"{local_dir}/raw/a.jsonl", b'[1]\n{"id": 1, "score": "2"}\n')
    put_bytes(f"{local_dir}/raw/b.parquet", b"garbage")
    p = Pipeline(_spec(local_dir, {"source": {"format": "jsonl", "uri": f"{local_dir}/raw"},
                                   "transforms": [{"cast": {"columns": {"score": "int32"}}}]},
                       on_error=policy))
    assert p.check().field("score").type == pa.int32()
    with pytest.raises(Exception, match=r"a\.jsonl: line 1 \(row 0\) is JSON array"):
        Pipeline(_spec(local_dir, {"source": {"format": "jsonl", "uri": f"{local_dir}/raw"},
                                   "transforms": []}, on_error="fail")).check()
    put_bytes(f"{local_dir}/pq/a.parquet", b"garbage")
    put_bytes(f"{local_dir}/pq/b.parquet", _parquet_bytes(pa.table({"id": [1]})))
    spec = _spec(local_dir, {"source": {"format": "parquet", "uri": f"{local_dir}/pq"},
                             "transforms": []}, on_error=policy)
    assert Pipeline(spec).check().names == ["id"]


def test_replaced_run_leaves_no_stale_quarantine(ray_cluster, local_dir):
    corpus = _text_corpus(local_dir)
    Pipeline(_spec(local_dir, corpus, on_error="quarantine")).run()
    assert len(_quarantined(f"{local_dir}/out")) == 1
    # Another pipeline (other policy, other fingerprint) replaces the dataset.
    r = Pipeline(_spec(local_dir, corpus, on_error="skip")).run(overwrite=True)
    assert r.rows_skipped == 1
    assert _quarantined(f"{local_dir}/out") == []
    # The replaced version keeps its own quarantine until vacuum removes the version.
    assert len(_quarantined(f"{local_dir}/out", version=1)) == 1
    import time

    from slicefeed.connectors import vacuum

    vacuum(f"{local_dir}/out", retain_hours=0, now=time.time() + 1)
    q = resolve_filesystem(f"{local_dir}/out/_quarantine")
    assert not q.fs.exists(q.path) or not q.fs.find(q.path)


def test_pipeline_fuses_decode_and_resize_with_unchanged_output_and_counts(ray_cluster,
                                                                           local_dir):
    """A pipeline's decode_image then resize (exact size) run as one step: the
    rows written equal the two transforms applied one by one (PNG and JPEG), and
    each transform keeps its own counts (the bad images are decode_image's)."""
    from PIL import Image

    from slicefeed.connectors import read_manifest
    from slicefeed.transforms import DecodeImage, Resize, read_images, split_errors

    rng = np.random.default_rng(0)
    images = []
    for i in range(6):
        buf = io.BytesIO()
        a = rng.integers(0, 256, (30 + 5 * i, 44 - 3 * i, 3), dtype=np.uint8)
        Image.fromarray(a).save(buf, format="PNG" if i % 2 else "JPEG")
        images.append(buf.getvalue())
    table = pa.table({"label": list(range(8)),
                      "image": pa.array(images + [b"\x89PNG garbage", None], pa.binary())})
    put_bytes(f"{local_dir}/raw/img.parquet", _parquet_bytes(table))
    corpus = {"source": {"format": "parquet", "uri": f"{local_dir}/raw"},
              "transforms": [{"decode_image": {"column": "image"}},
                             {"resize": {"column": "image", "height": 12, "width": 10}}],
              "read": 8, "written": 6, "bad": 2}
    report = Pipeline(_spec(local_dir, corpus, on_error="quarantine")).run()
    _assert_adds_up(report, corpus)
    counts = [{k: t[k] for k in ("name", "rows_in", "rows_out", "rows_bad")}
              for t in report.transforms]
    assert counts == [
        {"name": "decode_image", "rows_in": 8, "rows_out": 6, "rows_bad": 2},
        {"name": "resize", "rows_in": 6, "rows_out": 6, "rows_bad": 0},
    ]
    assert sorted((r["_sf_row"], r["transform"]) for r in _quarantined(f"{local_dir}/out")) == [
        (6, "decode_image"), (7, "decode_image")]
    out = f"{local_dir}/out"
    written = pa.concat_tables([pq.read_table(f"{out}/{f.path}")
                                for f in read_manifest(out).files]).sort_by("label")
    want = Resize(height=12, width=10)(split_errors(DecodeImage()(table))[0])
    assert written.column("label").to_pylist() == list(range(6))
    np.testing.assert_array_equal(read_images(written.column("image"))[0],
                                  read_images(want.column("image"))[0])
