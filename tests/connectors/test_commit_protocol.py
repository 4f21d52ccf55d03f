"""The commit protocol: put-if-absent versions, concurrent writers, versioned overwrite, vacuum."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import ray

from slicefeed.connectors import (
    AlreadyCommittedError,
    CommitConflictError,
    Lease,
    NotCommittedError,
    current_version,
    is_committed,
    list_versions,
    read_dataset,
    read_manifest,
    resolve_filesystem,
    vacuum,
    write_parquet,
)

HERE = os.path.dirname(os.path.abspath(__file__))


def _ds(n: int, offset: int = 0) -> ray.data.Dataset:
    return ray.data.from_arrow(pa.table({"i": pa.array(range(offset, offset + n), pa.int64())}))


def _values(uri: str, **kw) -> list[int]:
    return sorted(r["i"] for r in read_dataset(uri, **kw).take_all())


def _shards(uri: str) -> set[str]:
    t = resolve_filesystem(uri)
    return {p.rsplit("/", 1)[-1] for p in t.fs.ls(t.path, detail=False, **(
        {"refresh": True} if t.protocol == "gs" else {})) if p.endswith(".parquet")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_concurrent_writers_exactly_one_commits(ray_cluster, base_uri, tmp_path):
    """Two real writer processes race for the same sink: one commits, one gets a named
    conflict and removes only its own shards; the committed dataset is whole."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # Both writers are drivers on the session's cluster (no Ray start-up each).
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    procs = []
    for me, other in (("1", "2"), ("2", "1")):
        out = tmp_path / f"out-{me}.json"
        procs.append((out, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_concurrent_writer.py"), base_uri, me, other,
             str(barrier), "40", str(out)], env=env, start_new_session=True)))
    for _, p in procs:
        assert p.wait(timeout=500) == 0
    results = [json.loads(out.read_text()) for out, _ in procs]
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["committed", "conflict"], results
    won = next(r for r in results if r["status"] == "committed")
    lost = next(r for r in results if r["status"] == "conflict")
    assert lost["version"] == won["version"] == 1
    assert "CommitConflictError" in lost["error"] or "another writer" in lost["error"]
    m = read_manifest(base_uri)
    assert m.version == 1 and m.writer == won["writer"] and sorted(f.path for f in m.files) == sorted(won["files"])
    offset = 1000 * int(m.fingerprint.rsplit("-", 1)[1])
    assert _values(base_uri) == list(range(offset, offset + 40))
    # Every listed shard exists, and the loser's shards are gone: only the winner's remain.
    assert _shards(base_uri) == set(won["files"])
    assert list(list_versions(base_uri)) == [1]


@pytest.mark.slow
def test_failed_overwrite_keeps_previous_version_current(ray_cluster, base_uri):
    write_parquet(_ds(10), base_uri, fingerprint="a")

    def refuse(manifest):
        raise RuntimeError("too many bad records")

    with pytest.raises(Exception, match="too many bad records"):
        write_parquet(_ds(5, 100), base_uri, overwrite=True, before_commit=refuse)
    m = read_manifest(base_uri)
    assert m.version == 1 and m.fingerprint == "a"
    assert _values(base_uri) == list(range(10))
    assert _shards(base_uri) == {f.path for f in m.files}  # the failed run removed its own


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_overwrite_keeps_old_version_readable_until_vacuum(ray_cluster, base_uri):
    m1 = write_parquet(_ds(10), base_uri, fingerprint="a")
    with pytest.raises(AlreadyCommittedError):
        write_parquet(_ds(5, 100), base_uri)
    m2 = write_parquet(_ds(5, 100), base_uri, overwrite=True, fingerprint="b")
    assert (m1.version, m2.version, m2.parent) == (1, 2, 1)
    assert current_version(base_uri) == 2
    assert _values(base_uri) == list(range(100, 105))
    assert _values(base_uri, version=1) == list(range(10))
    assert read_manifest(base_uri, version=1).fingerprint == "a"
    # Within the retention nothing goes; the current version never does.
    r = vacuum(base_uri)
    assert r.versions_removed == [] and r.files_removed == []
    assert _values(base_uri, version=1) == list(range(10))
    r = vacuum(base_uri, retain_hours=0, now=time.time() + 1)
    assert r.versions_removed == [1] and r.current == 2
    assert sorted(u.rsplit("/", 1)[-1] for u in r.files_removed) == sorted(f.path for f in m1.files)
    with pytest.raises(NotCommittedError, match=r"version 1 is not retained; retained versions: 2"):
        read_dataset(base_uri, version=1)
    assert _values(base_uri) == list(range(100, 105))
    assert vacuum(base_uri, retain_hours=0, now=time.time() + 10).versions_removed == []


def test_cleanup_never_removes_a_live_writers_or_adopted_shards(ray_cluster, base_uri):
    target = resolve_filesystem(base_uri)
    target.fs.makedirs(target.path, exist_ok=True)
    # Another writer is running: its lease is fresh and it has written a shard;
    # it also adopted a finished shard of a crashed run.
    other = Lease(target, "0therwriter1", ttl_s=600).start()
    try:
        for name in ("part-00000-0therwriter1.parquet", "part-00007-crashedrun99.parquet",
                     "part-00001-deadwriter77.parquet"):
            target.fs.pipe_file(target.join(name).path, b"shard bytes")
        other.adopt(["part-00007-crashedrun99.parquet"])
        m = write_parquet(_ds(4), base_uri)
        left = _shards(base_uri)
        assert {"part-00000-0therwriter1.parquet", "part-00007-crashedrun99.parquet"} <= left
        assert "part-00001-deadwriter77.parquet" not in left  # nobody owns it
        assert {f.path for f in m.files} <= left
    finally:
        other.release()
    # Once the other writer is gone, its unlisted files are strays.
    vacuum(base_uri)
    assert _shards(base_uri) == {f.path for f in m.files}


def test_a_losing_writer_never_removes_committed_or_adopted_shards(ray_cluster, base_uri):
    """A writer judged dead (paused past its lease) whose finished shards a
    rerun adopted and committed removed them when it resumed and lost: its
    cleanup deleted every shard named with its id, and the committed version
    listed missing files. A writer removes only its shards that no retained
    version lists and no live writer adopted."""
    from slicefeed.connectors._commit import remove_own

    target = resolve_filesystem(base_uri)
    m = write_parquet(_ds(6), base_uri)
    (writer,) = {f.writer for f in m.files}
    other = Lease(target, "rerunwriter1", ttl_s=600).start()
    try:
        extra = [f"part-00009-{writer}.parquet", f"part-00010-{writer}.parquet"]
        for name in extra:
            target.fs.pipe_file(target.join(name).path, b"shard bytes")
        other.adopt(extra[:1])
        remove_own(target, writer, [f.path for f in m.files] + extra)
        assert _shards(base_uri) == {f.path for f in m.files} | {extra[0]}
    finally:
        other.release()
    assert _values(base_uri) == list(range(6))


def test_a_writer_starting_during_a_cleanup_keeps_its_lease_and_shards(base_uri, monkeypatch):
    """A cleanup judged liveness once, from the leases listed at its start, so
    a writer that started just after (here: right after that listing) had its
    fresh lease deleted, and its first shards too, and then could not commit;
    a dead writer's shard it adopted meanwhile was deleted too. Leases are
    listed again after the shards, and each writer's lease read again, before
    anything is deleted."""
    from slicefeed.connectors import _commit
    from slicefeed.connectors._commit import cleanup

    target = resolve_filesystem(base_uri)
    target.fs.makedirs(target.path, exist_ok=True)
    late = Lease(target, "latewriter01", ttl_s=600)
    listed = _commit.live_writers

    def then_a_writer_starts(t, **kw):
        found = listed(t, **kw)
        if late._thread is None:  # after the first listing only
            late.start()
            target.fs.pipe_file(target.join("part-00000-latewriter01.parquet").path, b"shard")
            late.adopt(["part-00001-deadwriter01.parquet"])  # as a crash rerun does
        return found

    # A dead writer's shard, which the late writer adopts.
    target.fs.pipe_file(target.join("part-00001-deadwriter01.parquet").path, b"shard")
    monkeypatch.setattr(_commit, "live_writers", then_a_writer_starts)
    try:
        cleanup(target)
        monkeypatch.setattr(_commit, "live_writers", listed)
        assert late.lost() is None
        assert {"part-00000-latewriter01.parquet", "part-00001-deadwriter01.parquet"} <= _shards(
            base_uri)
    finally:
        late.release()


def _write_v1(local_dir: str, sizes: list[int]) -> None:
    """A dataset as slicefeed 0.1 wrote it: part files and a v1 ``_manifest.json``."""
    import base64
    import hashlib
    import io

    import pyarrow.parquet as pq

    files, start = [], 0
    for k, n in enumerate(sizes):
        t = pa.table({"i": pa.array(range(start, start + n), pa.int64())})
        buf = io.BytesIO()
        pq.write_table(t, buf)
        data = buf.getvalue()
        name = f"part-{k:05d}-0ldrun.parquet"
        with open(os.path.join(local_dir, name), "wb") as f:
            f.write(data)
        files.append({"path": name, "num_rows": n, "num_bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})
        start += n
    doc = {"format": "slicefeed.dataset/v1", "created_at": "2026-01-01T00:00:00+00:00",
           "fingerprint": "old", "num_rows": start, "num_bytes": sum(f["num_bytes"] for f in files),
           "schema": base64.b64encode(t.schema.serialize().to_pybytes()).decode(),
           "columns": {"i": "int64"}, "files": files, "metadata": {}}
    with open(os.path.join(local_dir, "_manifest.json"), "w") as f:
        json.dump(doc, f)


@pytest.mark.slow
def test_version_1_manifest_reads_as_version_1_and_overwrite_makes_2(ray_cluster, local_dir):
    _write_v1(local_dir, [3, 2])
    m = read_manifest(local_dir)
    assert m.version == 1 and m.format == "slicefeed.dataset/v1" and m.num_rows == 5
    assert _values(local_dir) == list(range(5))
    m2 = write_parquet(_ds(4, 50), local_dir, overwrite=True)
    assert m2.version == 2 and read_manifest(local_dir).version == 2
    assert _values(local_dir) == list(range(50, 54))
    assert _values(local_dir, version=1) == list(range(5))


def test_lost_create_response_is_read_back(gcs, bucket):
    """The version create reaches GCS but its response is lost; gcsfs retries and
    gets 412: the writer reads the object back, finds its own id, and has won."""
    from slicefeed.connectors import Manifest
    from slicefeed.connectors._writers import commit_version
    from tests._faultproxy import FaultProxy


    with FaultProxy(gcs.host, rate=1.0, faults=("reset_mid",), max_faults=1) as proxy:
        target = resolve_filesystem(f"gs://{bucket}/ds", anonymous=True,
                                    storage_options={"endpoint_url": proxy.endpoint})
        m = Manifest(files=(), schema=pa.schema([("i", pa.int64())]), version=1, writer="w1")
        commit_version(target, m)
        assert proxy.injected["reset_mid"] == 1
        assert sum("/upload/" in r for r in proxy.requests) >= 2  # the retried create
        assert read_manifest(target).writer == "w1"
        # A different writer creating the same version loses.
        with pytest.raises(CommitConflictError, match="another writer .w1. committed version 1"):
            commit_version(target, Manifest(files=(), schema=m.schema, version=1, writer="w2"))
    assert is_committed(f"gs://{bucket}/ds")
