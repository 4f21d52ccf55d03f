"""Committed datasets: write_parquet -> manifest version -> read_dataset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest
import ray

from slicefeed.connectors import (
    AlreadyCommittedError,
    NotCommittedError,
    is_committed,
    read_dataset,
    read_manifest,
    resolve_filesystem,
    write_parquet,
)

HERE = os.path.dirname(os.path.abspath(__file__))


def _table(n: int = 40) -> pa.Table:
    fsl = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.int32)), 4)
    return pa.table(
        {
            "i": pa.array(np.arange(n, dtype=np.int64)),
            "f": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
            "s": pa.array([f"row {k}" for k in range(n)]),
            "l": pa.array([list(range(k % 5)) for k in range(n)], pa.list_(pa.int32())),
            "fsl": fsl,
        }
    )


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("i")


@pytest.mark.slow
def test_round_trip_same_rows_same_schema(ray_cluster, base_uri):
    table = _table()
    ds = ray.data.from_arrow(table).repartition(3)
    manifest = write_parquet(ds, base_uri, fingerprint="fp-1", metadata={"note": "x"})
    assert manifest.num_rows == 40 and len(manifest.files) == 3
    assert all(len(f.sha256) == 64 and f.num_bytes > 0 for f in manifest.files)
    again = read_manifest(base_uri)
    assert again.files == manifest.files and again.fingerprint == "fp-1"
    assert again.metadata["note"] == "x"
    assert again.schema.equals(table.schema)
    out = read_dataset(base_uri).to_arrow_refs()
    got = pa.concat_tables(ray.get(out))
    assert got.schema.equals(table.schema), (got.schema, table.schema)
    assert _sorted(got).equals(_sorted(table))


def test_manifest_checksums_match_files(ray_cluster, base_uri):
    import hashlib

    write_parquet(ray.data.from_arrow(_table()).repartition(2), base_uri)
    target = resolve_filesystem(base_uri)
    for f in read_manifest(base_uri).files:
        data = target.fs.cat_file(target.join(f.path).path)
        assert len(data) == f.num_bytes
        assert hashlib.sha256(data).hexdigest() == f.sha256


def test_refuses_existing_unless_overwrite(ray_cluster, base_uri):
    write_parquet(ray.data.from_arrow(_table(10)), base_uri, fingerprint="a")
    with pytest.raises(AlreadyCommittedError, match="already holds a committed dataset .10 rows, fingerprint a.. Pass overwrite=True"):
        write_parquet(ray.data.from_arrow(_table(5)), base_uri)
    old = read_manifest(base_uri)
    m = write_parquet(ray.data.from_arrow(_table(5)), base_uri, overwrite=True)
    assert m.num_rows == 5 and read_dataset(base_uri).count() == 5
    # The replaced version stays readable, with its shards, until vacuum.
    assert read_dataset(base_uri, version=old.version).count() == 10
    target = resolve_filesystem(base_uri)
    shards = [p for p in target.fs.ls(target.path, detail=False) if p.endswith(".parquet")]
    assert len(shards) == len(m.files) + len(old.files)


def test_prefix_without_manifest_is_refused(ray_cluster, base_uri):
    target = resolve_filesystem(base_uri)
    target.fs.pipe_file(target.join("part-00000-stray.parquet").path, b"junk")
    assert not is_committed(base_uri)
    with pytest.raises(NotCommittedError, match=r"is not a committed slicefeed dataset: it has no manifest"):
        read_dataset(base_uri)
    with pytest.raises(FileNotFoundError):
        read_manifest(f"{base_uri}/elsewhere")


def test_unknown_column(ray_cluster, base_uri):
    write_parquet(ray.data.from_arrow(_table(4)), base_uri)
    with pytest.raises(KeyError, match=r"column\(s\) \['nope'\] not in the dataset; available: i, f, s, l, fsl"):
        read_dataset(base_uri, columns=["nope"])


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from tests._harness import configure_process_env
    configure_process_env()
    import numpy as np, pyarrow as pa, ray
    from slicefeed.connectors import write_parquet
    # A driver on the test session's cluster (RAY_ADDRESS): the kill ends the
    # driver, and Ray then ends its job's tasks.
    ray.init(log_to_driver=False, configure_logging=False)

    def slow(batch):
        # Signal after the first shard is on its way, then stall so the parent kills us.
        if batch["i"][0] >= 10:
            open({flag!r}, "w").close()
            time.sleep(60)
        return batch

    ds = ray.data.range(40, override_num_blocks=4).map_batches(
        lambda b: {{"i": b["id"]}}, batch_size=10
    ).map_batches(slow, batch_size=10)
    write_parquet(ds, {uri!r})
    """
)


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_killed_writer_leaves_no_manifest_then_rerun_commits(ray_cluster, base_uri, tmp_path):
    flag = str(tmp_path / "started")
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER.format(root=os.path.dirname(os.path.dirname(HERE)), flag=flag, uri=base_uri))
    # The killed writer's lease expires 3 s after its last refresh; then its
    # shards are strays that the next commit removes.
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True,
                            env={**os.environ, "SLICEFEED_LEASE_TTL_S": "3",
                                 "RAY_ADDRESS": ray.get_runtime_context().gcs_address})
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            assert proc.poll() is None, "writer exited before it could be killed"
            assert time.monotonic() < deadline, "writer never reached the stall"
            time.sleep(0.2)
        time.sleep(1.0)  # let the first shard land
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not is_committed(base_uri)
    with pytest.raises(NotCommittedError):
        read_dataset(base_uri)
    target = resolve_filesystem(base_uri)
    strays = [p for p in target.fs.find(target.path) if p.endswith(".parquet")]
    time.sleep(3.5)
    # Put a stray shard there for sure: a crashed run may or may not have left one.
    target.fs.pipe_file(target.join("part-00099-crashed.parquet").path, b"not parquet at all")
    m = write_parquet(
        ray.data.range(40, override_num_blocks=4).map_batches(lambda b: {"i": b["id"]}),
        base_uri,
    )
    assert m.num_rows == 40
    assert sorted(r["i"] for r in read_dataset(base_uri).take_all()) == list(range(40))
    left = sorted(p.rsplit("/", 1)[-1] for p in target.fs.find(target.path) if p.endswith(".parquet"))
    assert left == sorted(f.path for f in m.files), (left, strays)
    doc = json.loads(target.fs.cat_file(target.join("_versions", f"{m.version:020d}.json").path))
    assert doc["num_rows"] == 40 and doc["format"] == "slicefeed.dataset/v2"


def test_shards_of_other_types_are_refused_and_of_other_nullability_agree():
    """The schema a write commits: shards that differ in a column's type are
    refused, naming both files and the fix; shards that differ only in whether
    a column is declared not null agree on a nullable column (the field
    metadata must still match: it marks bfloat16 bits)."""
    import pyarrow as pa
    import pytest

    from slicefeed.connectors._writers import _common_schema

    def shard(i: int, *fields: pa.Field) -> dict:
        return {"path": f"part-{i}.parquet", "input": f"in/{i}.parquet",
                "schema": pa.schema(fields).serialize().to_pybytes()}

    required = pa.field("v", pa.int64(), nullable=False)
    got = _common_schema([shard(0, pa.field("id", pa.int32()), required),
                          shard(1, pa.field("id", pa.int32()), required.with_nullable(True)),
                          shard(2, pa.field("id", pa.int32()), required)], "mem://out")
    assert got == pa.schema([pa.field("id", pa.int32()), pa.field("v", pa.int64())])
    with pytest.raises(ValueError, match=r"mem://out: the rows of input file in/0.parquet and of input "
                                         r"file in/1.parquet have different types \('v': int64 vs "
                                         r"string\)\. Add a `cast` transform"):
        _common_schema([shard(0, required), shard(1, pa.field("v", pa.string()))], "mem://out")
    marked = required.with_metadata({b"slicefeed.dtype": b"bfloat16"})
    with pytest.raises(ValueError, match=r"different types \('v': int64 not null vs int64 nullable\)"):
        _common_schema([shard(0, marked), shard(1, required.with_nullable(True))], "mem://out")
