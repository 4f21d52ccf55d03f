"""What is read must be what was committed: manifests validated on load, shards
checked against the manifest (size always, SHA-256 with verify, row counts)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from slicefeed.connectors import (
    CorruptManifestError,
    ShardMismatchError,
    list_versions,
    read_dataset,
    resolve_filesystem,
    write_parquet,
)
from tests._harness import run_slicefeed

_slicefeed = run_slicefeed


def _commit(uri: str, n: int = 12, parts: int = 3):
    t = pa.table({"i": pa.array(range(n), pa.int64())})
    return write_parquet(ray.data.from_arrow(t).repartition(parts), uri)


def _version_file(uri: str):
    (loc,) = list_versions(uri).values()
    return loc


def _tamper(uri: str, edit) -> None:
    loc = _version_file(uri)
    doc = json.loads(loc.fs.cat_file(loc.path))
    edit(doc)
    loc.fs.pipe_file(loc.path, json.dumps(doc).encode())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["files"][0].update(path="../../outside/secret.parquet"),
     r"files\[0\]\.path '\.\./\.\./outside/secret\.parquet' is not a plain file name inside the dataset prefix"),
    (lambda d: d["files"][0].update(path="/etc/passwd"), r"files\[0\]\.path '/etc/passwd' is not a plain file name"),
    (lambda d: d["files"][0].update(path="gs://other-bucket/x.parquet"), r"is not a plain file name"),
    (lambda d: d["files"][0].update(num_rows=-1000), r"at files/0/num_rows: -1000 is less than the minimum of 0"),
    (lambda d: d["files"][0].update(num_rows="4"), r"at files/0/num_rows: '4' is not of type 'integer'"),
    (lambda d: d["files"][0].update(num_bytes=1.5), r"at files/0/num_bytes: 1.5 is not of type 'integer'"),
    (lambda d: d.update(schema="bm90IGFuIGFycm93IHNjaGVtYQ=="), r"its schema does not parse"),
    (lambda d: d.update(num_rows=5), r"num_rows is 5, but its files add up to 12"),
    (lambda d: d.update(report="../../x.json"), r"report '\.\./\.\./x\.json' is not a path inside the dataset prefix"),
    (lambda d: d.update(version=7), r"it says version 7 but is stored as version 1"),
])
@pytest.mark.slow
def test_tampered_manifest_is_a_named_error(ray_cluster, base_uri, edit, message):
    _commit(base_uri)
    _tamper(base_uri, edit)
    with pytest.raises(CorruptManifestError, match=message) as e:
        read_dataset(base_uri)
    assert "_versions/00000000000000000001.json is not a valid slicefeed manifest" in str(e.value)


def test_tampered_v1_manifest_cannot_reach_outside_the_prefix(ray_cluster, local_dir):
    outside = os.path.join(os.path.dirname(local_dir), "outside")
    os.makedirs(outside)
    pq.write_table(pa.table({"secret": ["s3cr3t"]}), os.path.join(outside, "secret.parquet"))
    import base64

    schema = pa.schema([("secret", pa.string())])
    doc = {"format": "slicefeed.dataset/v1", "schema": base64.b64encode(
        schema.serialize().to_pybytes()).decode(), "files": [
        {"path": "../outside/secret.parquet", "num_rows": 1, "num_bytes": 10, "sha256": "0" * 64}]}
    with open(os.path.join(local_dir, "_manifest.json"), "w") as f:
        json.dump(doc, f)
    with pytest.raises(CorruptManifestError, match="is not a plain file name inside the dataset prefix"):
        read_dataset(local_dir)


def _shard(uri: str, m, k: int = 0):
    t = resolve_filesystem(uri)
    return t.join(m.files[k].path)


def test_replaced_shard_same_size_is_caught_by_verify(ray_cluster, base_uri):
    m = _commit(base_uri)
    loc = _shard(base_uri, m, 1)
    data = bytearray(loc.fs.cat_file(loc.path))
    # Flip a byte inside the column data: same size, other content.
    data[8] ^= 0xFF  # inside the first page, not the footer
    loc.fs.pipe_file(loc.path, bytes(data))
    read_dataset(base_uri)  # sizes agree: only verify reads the bytes
    with pytest.raises(ShardMismatchError, match=rf"{m.files[1].path}: SHA-256 .* differs from the manifest"):
        read_dataset(base_uri, verify=True)


def test_shard_of_other_size_is_caught_without_verify(ray_cluster, base_uri):
    m = _commit(base_uri)
    loc = _shard(base_uri, m, 2)
    data = loc.fs.cat_file(loc.path)
    loc.fs.pipe_file(loc.path, data[: len(data) // 2])  # truncated
    with pytest.raises(ShardMismatchError, match=rf"{m.files[2].path}: {len(data) // 2} bytes, the manifest says {len(data)}"):
        read_dataset(base_uri)


def test_shard_with_other_row_count_is_a_named_error(ray_cluster, local_dir):
    """A shard replaced by a valid Parquet file with other rows (the manifest's size
    and checksum updated too, as a careless repair would): the row count differs."""
    import hashlib
    import io

    m = _commit(local_dir)
    name = m.files[0].path
    buf = io.BytesIO()
    pq.write_table(pa.table({"i": pa.array(range(100, 107), pa.int64())}), buf)
    data = buf.getvalue()
    with open(os.path.join(local_dir, name), "wb") as f:
        f.write(data)

    def edit(d):
        d["files"][0].update(num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        d["num_bytes"] = sum(f["num_bytes"] for f in d["files"])
    _tamper(local_dir, edit)
    with pytest.raises(ShardMismatchError, match=rf"{name}: 7 rows, the manifest says {m.files[0].num_rows}"):
        read_dataset(local_dir)


def test_loader_checks_shard_size_and_rows(ray_cluster, jax_cpu, local_dir):
    from slicefeed.pipelines import JaxLoader

    m = _commit(local_dir, n=64, parts=4)
    name = m.files[3].path
    path = os.path.join(local_dir, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-9])  # truncated
    msg = rf"{name}: {len(data) - 9} bytes, the manifest says {len(data)}"
    with pytest.raises(ShardMismatchError, match=msg), \
            JaxLoader(local_dir, global_batch_size=8, num_epochs=1,
                      dtypes={"i": "int32"}) as loader:
        for _ in loader:
            pass


def test_inspect_verify_names_the_first_bad_shard(ray_cluster, local_dir):
    m = _commit(local_dir)
    r = _slicefeed("inspect", "--verify", local_dir)
    assert r.returncode == 0 and "verified: 3 shards" in r.stdout, r.stderr
    for k in (2, 1):
        path = os.path.join(local_dir, m.files[k].path)
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[8] ^= 0xFF  # inside the first page, not the footer
        with open(path, "wb") as f:
            f.write(bytes(data))
    r = _slicefeed("inspect", "--verify", local_dir)
    assert r.returncode == 1, r.stdout
    assert f"ShardMismatchError: {local_dir}/{m.files[1].path}: SHA-256" in r.stderr, r.stderr
    r = _slicefeed("inspect", local_dir)
    assert r.returncode == 0, r.stderr  # without --verify, sizes and row counts only
