"""Transient GCS faults are retried; permanent ones fail fast with a clear message.

Faults are injected at the network edge by tests/_faultproxy.FaultProxy in
front of the real GCS emulator; gcsfs, pyarrow and Ray Data run unpatched.
"""

from __future__ import annotations

import hashlib
import io
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import resolve_filesystem
from slicefeed.connectors._retry import TRANSIENT_MARKER, RetryingGCSFileSystem
from tests._faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(240)

N_FILES = 24


def _table(i: int) -> pa.Table:
    n = 50 + i
    return pa.table(
        {
            "id": pa.array(range(i * 1000, i * 1000 + n), pa.int64()),
            "text": pa.array([f"file {i} row {r} " * (r % 5 + 1) for r in range(n)]),
            "x": pa.array([r * 0.5 for r in range(n)], pa.float32()),
        }
    )


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=16)
    return buf.getvalue()


@pytest.fixture
def inputs(gcs, bucket) -> str:
    """N_FILES small Parquet files written straight to the emulator (no proxy)."""
    rp = resolve_filesystem(f"gs://{bucket}/in")
    for i in range(N_FILES):
        rp.fs.pipe(rp.join(f"part-{i:03d}.parquet").path, _parquet_bytes(_table(i)))
    return f"gs://{bucket}/in"


def _copy_with_pyarrow(src: str, dst: str, endpoint: str) -> None:
    """Lists, reads and rewrites every file of ``src`` under ``dst`` via gcsfs."""
    opts = {"endpoint_url": endpoint}
    s = resolve_filesystem(src, storage_options=opts)
    d = resolve_filesystem(dst, storage_options=opts)
    for path in s.fs.find(s.path):
        name = path.rsplit("/", 1)[1]
        table = pq.read_table(path, filesystem=s.fs)
        with d.fs.open(d.join(name).path, "wb") as f:
            pq.write_table(table, f, row_group_size=16)


def _digests(uri: str) -> dict[str, str]:
    rp = resolve_filesystem(uri)  # straight to the emulator
    rp.fs.invalidate_cache()
    return {
        p.rsplit("/", 1)[1]: hashlib.sha256(rp.fs.cat_file(p)).hexdigest()
        for p in rp.fs.find(rp.path)
    }


@pytest.mark.slow
def test_pyarrow_copy_under_10pct_faults_is_byte_identical(gcs, bucket, inputs):
    _copy_with_pyarrow(inputs, f"gs://{bucket}/clean", gcs.endpoint)
    with FaultProxy(gcs.host, rate=0.10, seed=5, delay_s=0.3) as proxy:
        _copy_with_pyarrow(inputs, f"gs://{bucket}/faulty", proxy.endpoint)
    clean, faulty = _digests(f"gs://{bucket}/clean"), _digests(f"gs://{bucket}/faulty")
    assert len(clean) == N_FILES
    assert faulty == clean
    # The faults really happened, of several kinds.
    assert proxy.injected_total >= 5, proxy.injected
    assert len(proxy.injected) >= 3, proxy.injected


def _job(src: str, dst: str, endpoint: str):
    """A slicefeed job: read every input file (with provenance), commit the result."""
    from slicefeed.connectors import read_parquet, write_parquet

    opts = {"storage_options": {"endpoint_url": endpoint}}
    ds = read_parquet(src, provenance=True, **opts)
    return write_parquet(ds, dst, fingerprint="faults-test", **opts)


@pytest.mark.slow
def test_job_under_10pct_faults_commits_identical_dataset(ray_cluster, gcs, bucket, inputs):
    clean = _job(inputs, f"gs://{bucket}/clean-job", gcs.endpoint)
    with FaultProxy(gcs.host, rate=0.10, seed=11, delay_s=0.3) as proxy:
        faulty = _job(inputs, f"gs://{bucket}/faulty-job", proxy.endpoint)
    assert proxy.injected_total >= 3, proxy.injected
    assert clean.num_rows == faulty.num_rows == sum(50 + i for i in range(N_FILES))
    # Identical committed datasets: same shards (rows and checksums), same schema.
    assert [(f.num_rows, f.sha256) for f in faulty.files] == [
        (f.num_rows, f.sha256) for f in clean.files]
    assert faulty.schema.equals(clean.schema)
    # Every input row arrived exactly once (provenance says which file and row).
    from slicefeed.connectors import read_manifest

    m = read_manifest(f"gs://{bucket}/faulty-job")
    fs = resolve_filesystem(f"gs://{bucket}/faulty-job")
    rows = pa.concat_tables(
        pq.read_table(io.BytesIO(fs.fs.cat_file(fs.join(f.path).path))) for f in m.files)
    assert sorted(rows["id"].to_pylist()) == sorted(
        i for t in range(N_FILES) for i in _table(t)["id"].to_pylist())
    assert len(set(zip(rows["_sf_file"].to_pylist(), rows["_sf_row"].to_pylist()))) == rows.num_rows


def _forbidden_fs(proxy: FaultProxy) -> RetryingGCSFileSystem:
    return resolve_filesystem("gs://x", storage_options={"endpoint_url": proxy.endpoint}).fs


def test_403_fails_fast_with_uri_and_status(gcs, bucket, inputs):
    with FaultProxy(gcs.host, force=[(rf"/b/{bucket}/o", 403)]) as proxy:
        fs = _forbidden_fs(proxy)
        t0 = time.monotonic()
        with pytest.raises(PermissionError) as e:
            fs.cat_file(f"{bucket}/in/part-000.parquet")
        elapsed = time.monotonic() - t0
    msg = str(e.value)
    assert f"gs://{bucket}/in/part-000.parquet" in msg
    assert "403" in msg and "permission denied" in msg
    assert elapsed < 3.0, f"403 took {elapsed:.1f} s: it must not be retried"


def test_403_through_ray_data_fails_fast(ray_cluster, gcs, bucket, inputs):
    import ray.data

    with FaultProxy(gcs.host, force=[(rf"/b/{bucket}/o", 403)]) as proxy:
        fs = _forbidden_fs(proxy)
        t0 = time.monotonic()
        with pytest.raises(PermissionError) as e:
            ray.data.read_parquet(f"{bucket}/in", filesystem=fs).materialize()
        elapsed = time.monotonic() - t0
    assert f"gs://{bucket}/in" in str(e.value) and "403" in str(e.value)
    assert elapsed < 10.0, f"403 took {elapsed:.1f} s: it must not be retried"


def test_401_is_permission_error(gcs, bucket, inputs):
    with (FaultProxy(gcs.host, force=[(r"/o/", 401)]) as proxy,
          pytest.raises(PermissionError, match=rf"gs://{bucket}/in/part-001.parquet.*401")):
        _forbidden_fs(proxy).cat_file(f"{bucket}/in/part-001.parquet")


def test_404_names_the_gs_uri(gcs, bucket):
    fs = resolve_filesystem(f"gs://{bucket}").fs
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError, match=rf"gs://{bucket}/no/such file.*404"):
        fs.cat_file(f"{bucket}/no/such file")
    assert time.monotonic() - t0 < 3.0


@pytest.mark.slow
def test_stalled_responses_time_out_and_are_retried(gcs, bucket, inputs):
    import aiohttp

    with FaultProxy(gcs.host, rate=0.5, faults=("delay",), delay_s=1.5, seed=3) as proxy:
        fs = RetryingGCSFileSystem(
            token="anon",
            endpoint_url=proxy.endpoint,
            requests_timeout=aiohttp.ClientTimeout(sock_read=0.5),
        )
        data = fs.cat_file(f"{bucket}/in/part-002.parquet")
    assert data == _parquet_bytes(_table(2))
    assert proxy.injected["delay"] >= 1


def test_transient_error_that_outlives_retries_is_marked_for_ray(gcs, bucket, inputs):
    with FaultProxy(gcs.host, rate=1.0, faults=("503",)) as proxy:
        fs = RetryingGCSFileSystem(token="anon", endpoint_url=proxy.endpoint, retries=2)
        with pytest.raises(Exception) as e:
            fs.cat_file(f"{bucket}/in/part-003.parquet")
        assert proxy.injected["503"] == 2  # exactly `retries` attempts
    notes = "\n".join(getattr(e.value, "__notes__", []))
    assert TRANSIENT_MARKER in notes and f"gs://{bucket}/in/part-003.parquet" in notes


def test_ray_data_context_retries_marked_errors(ray_cluster, gcs):
    from ray.data import DataContext

    resolve_filesystem("gs://any")
    assert TRANSIENT_MARKER in DataContext.get_current().retried_io_errors
    # Ray Data matches these entries as substrings today and warns it will
    # match them as regular expressions: the marker matches itself either way.
    import re

    assert re.search(TRANSIENT_MARKER, f"OSError: x\n{TRANSIENT_MARKER} (after 6 tries)")


def test_retrying_filesystem_pickles_with_its_policy(gcs):
    import pickle

    fs = RetryingGCSFileSystem(token="anon", endpoint_url=gcs.endpoint, retries=3)
    clone = pickle.loads(pickle.dumps(fs))
    assert isinstance(clone, RetryingGCSFileSystem) and clone.retries == 3
