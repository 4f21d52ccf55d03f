"""Storage requests of a JaxLoader epoch over gs://, counted at the network edge.

The committed manifest records every shard's size and row groups, so the loader
must not ask the store for them again: per file and epoch it may send at most
two metadata requests (object ``GET`` without ``alt=media``, listings, ``HEAD``).
Counted by tests/_faultproxy.FaultProxy (forwarding everything) in front of the
real GCS emulator.
"""

from __future__ import annotations

import collections
import urllib.parse

import numpy as np

from tests._faultproxy import FaultProxy
from tests.pipelines._data import write_committed

SIZES = [30, 45, 17, 50]  # 142 rows, 4 files, row groups of 7 rows
EPOCHS = 2


def classify(request: str) -> tuple[str, str | None]:
    """``("data" | "metadata" | "other", object name or None)`` of a proxied
    ``"METHOD /path?query"`` request to the GCS JSON API."""
    method, _, target = request.partition(" ")
    path, _, query = target.partition("?")
    params = urllib.parse.parse_qs(query)
    if "/o/" not in path:
        # A listing names an object through its prefix (``fs.info`` of a
        # missing key, ``ls`` of a folder).
        prefix = params.get("prefix", [None])[0]
        return ("metadata" if method in ("GET", "HEAD") else "other"), prefix
    name = path.split("/o/", 1)[1]
    if method == "GET" and params.get("alt") == ["media"]:
        return "data", name
    if method in ("GET", "HEAD"):
        return "metadata", name
    return "other", name


def test_loader_sends_at_most_two_metadata_requests_per_file_and_epoch(gcs, bucket, jax_cpu):
    from slicefeed.pipelines import JaxLoader

    uri = f"gs://{bucket}/lm data"
    n = write_committed(uri, SIZES)
    with FaultProxy(gcs.host) as proxy:
        loader = JaxLoader(
            uri, global_batch_size=8, num_epochs=EPOCHS, remainder="drop", shuffle=True,
            storage_options={"storage_options": {"endpoint_url": proxy.endpoint}},
        )
        ids = np.concatenate([np.asarray(b["id"]) for b in loader])
        requests = list(proxy.requests)
    # Shuffled, whole files and rows dropped at random: each epoch's ids are distinct.
    per_epoch = len(ids) // EPOCHS
    for e in range(EPOCHS):
        got = ids[e * per_epoch:(e + 1) * per_epoch]
        assert len(set(got.tolist())) == per_epoch == n // 8 * 8

    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in requests:
        kind, name = classify(r)
        if name is not None and name.rstrip("/").endswith(".parquet"):
            per_file[name.rstrip("/").rsplit("/", 1)[-1]][kind] += 1
    assert sorted(per_file) == [f"part-{i:05d}.parquet" for i in range(len(SIZES))], requests
    for name, counts in per_file.items():
        assert counts["metadata"] <= 2 * EPOCHS, (name, dict(counts), requests)
        assert counts["data"] >= 1, (name, dict(counts))


def test_truncated_gs_shard_is_named_without_stat(gcs, bucket, jax_cpu):
    """Reading by the manifest's sizes still catches a shard of another size."""
    import pytest

    from slicefeed.connectors import ShardMismatchError, resolve_filesystem
    from slicefeed.pipelines import JaxLoader

    uri = f"gs://{bucket}/cut"
    write_committed(uri, SIZES)
    shard = resolve_filesystem(f"{uri}/part-00002.parquet")
    data = shard.fs.cat_file(shard.path)
    shard.fs.pipe_file(shard.path, data[:-9])
    msg = rf"part-00002.parquet: {len(data) - 9} bytes, the manifest says {len(data)}"
    with pytest.raises(ShardMismatchError, match=msg), \
            JaxLoader(uri, global_batch_size=8, num_epochs=1) as loader:
        for _ in loader:
            pass


def test_gs_batches_equal_local_batches_with_streamed_row_groups(gcs, bucket, local_dir,
                                                                 jax_cpu):
    """Ranged reads deliver the very batches a local read does, also when row
    groups are larger than a window (read in chunks) and windows are shuffled."""
    from slicefeed.pipelines import JaxLoader

    held = {}

    def batches(uri: str) -> list[list[int]]:
        write_committed(uri, SIZES, row_group_size=40)
        with JaxLoader(uri, global_batch_size=8, num_epochs=2, shuffle=True, seed=3,
                       shuffle_buffer_rows=16) as loader:
            out = [np.asarray(b["id"]).tolist() + np.asarray(b["x"])[:, 0].tolist()
                   for b in loader]
            held[uri.startswith("gs://")] = loader.stats()["read_ahead_bytes_max"]
            return out

    local = batches(f"{local_dir}/same")
    assert local and local == batches(f"gs://{bucket}/same")
    # Object storage: the compressed bytes fetched ahead count too (stats()).
    assert held[True] > held[False] > 0, held


def test_gs_windows_of_several_row_groups_decode_concurrently_as_local_ones(
        gcs, bucket, local_dir, jax_cpu, monkeypatch):
    """The row groups of a window fetched from object storage are decoded on
    several threads, each from its own view of the fetched bytes
    (_shards._SparseFile.twin), and deliver the batches a local read does."""
    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader import _jaxloader, _sources

    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", 64 * 48)  # ~48 bytes per row
    calls = []
    read_groups = _sources._read_groups

    def spy(pf, idx, columns, source, batch_rows):
        calls.append(len(idx) >= 2 and source is not None)
        return read_groups(pf, idx, columns, source, batch_rows)

    monkeypatch.setattr(_sources, "_read_groups", spy)

    def batches(uri: str) -> list[list[int]]:
        write_committed(uri, [64, 96, 48], row_group_size=16)
        calls.clear()
        with JaxLoader(uri, global_batch_size=16, num_epochs=2) as loader:
            out = [np.asarray(b["id"]).tolist() + np.asarray(b["x"]).ravel().tolist()
                   for b in loader]
        assert any(calls), "no window decoded its row groups concurrently"
        return out

    local = batches(f"{local_dir}/rowgroups")
    assert local == batches(f"gs://{bucket}/rowgroups")
    assert [b[:16] for b in local[:len(local) // 2]] == [
        list(range(i, i + 16)) for i in range(0, 208, 16)]


def test_fetch_cancelled_by_its_closing_reader_is_read_by_the_one_that_took_it(local_dir):
    """Two epochs' readers share the fetched-ahead bytes: one taken by the next
    epoch while the previous epoch's fetcher closes (cancelling what had not
    started) is read by the reader that took it, not raised as cancelled."""
    from concurrent.futures import Future

    from slicefeed.connectors import resolve_filesystem
    from slicefeed.pipelines._loader import _shards

    uri = f"{local_dir}/cancelled"
    write_committed(uri, [30])
    shard = resolve_filesystem(f"{uri}/part-00000.parquet")
    size = shard.fs.size(shard.path)
    spans = ((0, 30),)
    cancelled: Future = Future()
    cancelled.cancel()
    _shards._ahead[_shards._ahead_key(shard.fs, shard.path, spans, None)] = cancelled
    pf, _ = _shards.open_shard(shard.fs, shard.path, [30, size], spans, None)
    assert pf.read().column("id").to_pylist() == list(range(30))
