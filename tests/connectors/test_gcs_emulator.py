"""The test GCS emulator honours upload preconditions as real GCS does."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.parse
import urllib.request

import gcsfs
import pytest


def _fs(gcs) -> gcsfs.GCSFileSystem:
    return gcsfs.GCSFileSystem(token="anon", endpoint_url=gcs.endpoint)


def _upload(gcs, bucket: str, name: str, data: bytes, **params: str) -> tuple[int, dict]:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name, **params})
    req = urllib.request.Request(
        f"{gcs.endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_create_only_if_absent(gcs, bucket):
    fs = _fs(gcs)
    fs.pipe_file(f"{bucket}/a.json", b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{bucket}/a.json", b"second", mode="create")
    assert fs.cat_file(f"{bucket}/a.json") == b"first"
    # Unconditional writes still replace.
    fs.pipe_file(f"{bucket}/a.json", b"third")
    assert fs.cat_file(f"{bucket}/a.json") == b"third"


def test_generation_match_is_compare_and_swap(gcs, bucket):
    status, obj = _upload(gcs, bucket, "p", b"v1", ifGenerationMatch="0")
    assert status == 200
    gen = obj["generation"]
    status, err = _upload(gcs, bucket, "p", b"v2", ifGenerationMatch="0")
    assert status == 412 and err["error"]["code"] == 412
    status, obj2 = _upload(gcs, bucket, "p", b"v2", ifGenerationMatch=gen)
    assert status == 200 and obj2["generation"] != gen
    status, _ = _upload(gcs, bucket, "p", b"v3", ifGenerationMatch=gen)  # stale
    assert status == 412
    status, _ = _upload(gcs, bucket, "p", b"v3", ifGenerationNotMatch=obj2["generation"])
    assert status == 412
    assert _fs(gcs).cat_file(f"{bucket}/p") == b"v2"


def test_concurrent_creates_exactly_one_wins(gcs, bucket):
    def attempt(i: int) -> int:
        return _upload(gcs, bucket, "race", f"writer {i}".encode(), ifGenerationMatch="0")[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(attempt, range(16)))
    assert sorted(statuses) == [200] + [412] * 15
