"""DecodeImage against hostile inputs: paths that leave the declared root, other
schemes, decompression bombs and batches whose decoded images do not fit.

Every case is a counted bad record (the row is named by the bad-record
mechanism), never a read outside the root, a network request, or a decode of
a bomb.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import struct
import threading
import zlib

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image

from slicefeed.connectors import SpecError
from slicefeed.transforms import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    DecodeImage,
    apply_transforms,
    read_images,
    split_errors,
)
from tests._harness import put_bytes, run_slicefeed

_slicefeed = run_slicefeed


def _png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _pixels(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _claimed_size_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width x height`` (its pixel data is a
    few bytes: decoding it would allocate the full size, then fail as truncated)."""
    data = _png(np.zeros((1, 1, 3), np.uint8))
    ihdr = bytearray(data[8 : 8 + 25])  # length, b"IHDR", 13 bytes, crc
    ihdr[8:16] = struct.pack(">II", width, height)
    ihdr[21:25] = struct.pack(">I", zlib.crc32(bytes(ihdr[4:21])))
    return data[:8] + bytes(ihdr) + data[33:]


class _CountingServer:
    """A real HTTP server on loopback that serves a PNG and counts requests."""

    def __init__(self, body: bytes):
        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                counter.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args):
                pass

        self.requests = 0
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http_png():
    server = _CountingServer(_png(_pixels(5, 5, 9)))
    yield server
    server.close()


@pytest.fixture
def image_tree(tmp_path):
    """``root/`` with good images and a symlink out; ``secret.png`` next to it."""
    root = tmp_path / "images root"
    (root / "sub").mkdir(parents=True)
    good = _pixels(6, 7, 1)
    (root / "ok.png").write_bytes(_png(good))
    (root / "sub" / "two.png").write_bytes(_png(_pixels(4, 5, 2)))
    secret = tmp_path / "secret.png"
    secret.write_bytes(_png(_pixels(3, 3, 3)))
    os.symlink(secret, root / "link.png")
    return root, secret, good


def _attacks(root, secret, url: str) -> list[str]:
    return [
        "../secret.png",
        "sub/../../secret.png",
        str(secret),  # absolute
        f"file://{secret}",
        f"file:{secret}",
        f"{url}/x.png",
        "link.png",  # a symlink inside the root that points outside it
        "",
        "ok.png\x00.jpg",
    ]


def _path_table(paths: list[str | None]) -> pa.Table:
    n = len(paths)
    return pa.table({
        "path": pa.array(paths, pa.string()),
        PROVENANCE_FILE: ["list.jsonl"] * n,
        PROVENANCE_ROW: pa.array(range(n), pa.int64()),
    })


def test_paths_resolve_inside_the_declared_root_only(image_tree, http_png):
    root, secret, good = image_tree
    attacks = _attacks(root, secret, http_png.url)
    paths = ["ok.png", "sub/two.png", "sub/./../ok.png", *attacks]
    out = DecodeImage(column="path", output="image", root=str(root))(_path_table(paths))
    ok, bad = split_errors(out)
    assert ok.column(PROVENANCE_ROW).to_pylist() == [0, 1, 2]
    np.testing.assert_array_equal(read_images(ok.column("image"))[0][0], good)
    assert bad.column(PROVENANCE_ROW).to_pylist() == list(range(3, len(paths)))
    reasons = bad.column(ERROR_COLUMN).to_pylist()
    for path, why in zip(attacks, reasons):
        assert why.startswith("DecodeImage: path "), why
        assert "\x00" not in why
        assert any(k in why for k in ("outside the root", "not a path relative to the root",
                                      "is empty", "control character")), why
    assert "outside the root" in reasons[attacks.index("link.png")]
    assert http_png.requests == 0, "an http:// path made a request"
    # The bad-record mechanism names the file and row when the policy is fail.
    with pytest.raises(Exception, match=r"file 'list.jsonl' row 3: DecodeImage: path '../secret.png'"):
        apply_transforms(_path_table(paths), [DecodeImage(column="path", root=str(root))])


def test_a_path_column_needs_a_declared_root(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(_png(_pixels(3, 3, 0)))
    tbl = _path_table([str(p)])
    with pytest.raises(SpecError, match=r"DecodeImage: column 'path' holds paths; set root"):
        DecodeImage(column="path").output_schema(tbl.schema)
    out = DecodeImage(column="path")(tbl)  # applied without the check: a bad record, no read
    assert split_errors(out)[1].num_rows == 1
    # Binary columns need no root.
    DecodeImage(column="image").output_schema(pa.schema([("image", pa.binary())]))


def test_gcs_root_uses_the_given_storage_and_stays_inside(gcs, bucket):
    put_bytes(f"gs://{bucket}/imgs/a b.png", _png(_pixels(5, 6, 4)))
    put_bytes(f"gs://{bucket}/private/secret.png", _png(_pixels(2, 2, 5)))
    t = DecodeImage(column="path", root=f"gs://{bucket}/imgs").with_storage(anonymous=True)
    out = t(_path_table(["a b.png", "../private/secret.png", f"gs://{bucket}/private/secret.png"]))
    ok, bad = split_errors(out)
    assert ok.column(PROVENANCE_ROW).to_pylist() == [0]
    assert read_images(ok.column("path"))[0][0].shape == (5, 6, 3)
    assert bad.column(PROVENANCE_ROW).to_pylist() == [1, 2]
    # Storage options never show in the transform's spec or repr.
    assert "anonymous" not in repr(t) and "storage" not in json.dumps(t.to_spec())


def test_max_pixels_is_checked_from_the_header_before_decoding():
    bomb = _claimed_size_png(9_000, 8_000)  # 72 MP claimed in a ~70-byte file
    small = _png(_pixels(30, 40, 6))
    tbl = pa.table({
        "image": pa.array([small, bomb, small], pa.binary()),
        PROVENANCE_FILE: ["imgs.parquet"] * 3,
        PROVENANCE_ROW: pa.array([0, 1, 2], pa.int64()),
    })
    ok, bad = split_errors(DecodeImage()(tbl))
    assert ok.column(PROVENANCE_ROW).to_pylist() == [0, 2]
    (why,) = bad.column(ERROR_COLUMN).to_pylist()
    # Refused on its header: a decode would have failed as truncated instead.
    assert "9000x8000 (72,000,000 pixels)" in why and "max_pixels=64,000,000" in why, why
    with pytest.raises(Exception, match=r"row 1: .*9000x8000"):
        apply_transforms(tbl, [DecodeImage()])
    # A smaller explicit limit, and the fused decode+resize path, apply it too.
    ok, bad = split_errors(DecodeImage(max_pixels=1_000, height=8, width=8)(tbl))
    assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 1, 2]
    assert "30x40" not in bad.column(ERROR_COLUMN)[0].as_py()  # width x height: 40x30
    assert "40x30 (1,200 pixels)" in bad.column(ERROR_COLUMN)[0].as_py()
    with pytest.raises(SpecError, match="max_pixels"):
        DecodeImage(max_pixels=0)


def test_a_batch_holds_at_most_max_batch_bytes_of_decoded_images():
    imgs = [_pixels(50, 40, i) for i in range(5)]  # 6,000 decoded bytes each (RGB)
    tbl = pa.table({
        "image": pa.array([_png(a) for a in imgs], pa.binary()),
        PROVENANCE_FILE: ["imgs.parquet"] * 5,
        PROVENANCE_ROW: pa.array(range(5), pa.int64()),
    })
    out = DecodeImage(max_batch_bytes=13_000)(tbl)
    ok, bad = split_errors(out)
    assert ok.column(PROVENANCE_ROW).to_pylist() == [0, 1]
    for got, want in zip(read_images(ok.column("image"))[0], imgs):
        np.testing.assert_array_equal(got, want)
    assert bad.column(PROVENANCE_ROW).to_pylist() == [2, 3, 4]
    why = bad.column(ERROR_COLUMN)[0].as_py()
    assert "max_batch_bytes=13,000" in why and "smaller batches" in why, why
    # Resizing while decoding holds only the output: every row fits.
    ok, bad = split_errors(DecodeImage(max_batch_bytes=13_000, height=8, width=8)(tbl))
    assert ok.num_rows == 5 and bad.num_rows == 0
    # One image larger than the whole bound is refused even alone.
    ok, bad = split_errors(DecodeImage(max_batch_bytes=5_000, height=8, width=8)(tbl))
    assert bad.num_rows == 5


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_slicefeed_run_counts_hostile_image_paths_as_bad_records(tmp_path, image_tree, http_png):
    root, secret, _ = image_tree
    (root / "bomb.png").write_bytes(_claimed_size_png(9_000, 8_000))
    paths = ["ok.png", "sub/two.png", *_attacks(root, secret, http_png.url), "bomb.png"]
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "list.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    spec = {
        "name": "images-hostile",
        "source": {"format": "jsonl", "uri": str(raw)},
        "transforms": [{"decode_image": {"column": "path", "output": "image", "root": str(root),
                                         "height": 4, "width": 4}},
                       {"select": {"columns": ["image"]}}],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
        "on_error": "quarantine",
        "max_error_fraction": 0.95,
    }
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    assert _slicefeed("validate", str(spec_path)).returncode == 0
    r = _slicefeed("run", str(spec_path), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["rows_read"] == len(paths)
    assert report["rows_written"] == 2
    assert report["rows_quarantined"] == len(paths) - 2
    assert http_png.requests == 0
    # A root on another filesystem than the source's is refused before any work.
    spec["transforms"][0]["decode_image"]["root"] = "memory://elsewhere/images"
    spec_path.write_text(yaml.safe_dump(spec))
    r = _slicefeed("validate", str(spec_path))
    assert r.returncode == 2 and "source's filesystem" in r.stderr, r.stderr[-2000:]


def test_a_pipeline_reads_images_with_the_matching_source_storage(tmp_path):
    from slicefeed.pipelines import Pipeline

    def spec(root: str, sources: list[dict]) -> dict:
        return {
            "name": "images-root",
            "sources": sources,
            "transforms": [{"decode_image": {"column": "path", "root": root}}],
            "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
        }

    local = {"name": "a", "format": "jsonl", "uri": str(tmp_path / "raw")}
    gcs = {"name": "b", "format": "jsonl", "uri": "gs://other-bucket/raw",
           "storage": {"anonymous": True, "project": "p"}}
    p = Pipeline(spec("gs://imgs-bucket/images", [local, gcs]))
    assert p.transforms[0].storage == {"anonymous": True, "project": "p"}
    assert Pipeline(spec(str(tmp_path / "images"), [local, gcs])).transforms[0].storage == {}
    with pytest.raises(SpecError, match=r"root memory://x/images is not on the source's filesystem"):
        Pipeline(spec("memory://x/images", [local, gcs]))
