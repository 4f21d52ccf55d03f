"""Reads that decode only what they deliver: row-group windows, streamed large
row groups, decoded/delivered counters, and write_parquet's row-group bound."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines._data import make_table, write_committed


@pytest.fixture(scope="module")
def datasets(ray_cluster, tmp_path_factory):
    """Two committed datasets of the same 1,000 rows: one written by write_parquet
    (row groups bounded to 2 KiB of decoded rows, ~30 rows), one by plain pyarrow
    (its default row groups: each file is one row group)."""
    import ray

    from slicefeed.connectors import read_manifest, write_parquet

    root = tmp_path_factory.mktemp("rowgroups")
    bounded = str(root / "write_parquet")
    t = make_table(0, 1000)
    write_parquet(ray.data.from_arrow(t).repartition(2), bounded, row_group_bytes=2048)
    plain = str(root / "pyarrow")
    write_committed(plain, [300, 450, 250], row_group_size=1 << 20)
    assert len(read_manifest(plain).files[0].row_groups) == 1
    return {"write_parquet": bounded, "pyarrow": plain}


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("kind", ["write_parquet", "pyarrow"])
def test_decoded_rows_per_delivered_row_at_most_1_1(
    jax_cpu, datasets, monkeypatch, kind, shuffle
):
    """Windows (~64 rows here) much smaller than the row groups of the plain dataset
    (up to 450 rows) and larger than those of write_parquet's (~30 rows): over an
    epoch on one host every row is decoded about once."""
    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader import _jaxloader

    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", 64 * 45)  # ~45 bytes per row
    loader = JaxLoader(datasets[kind], global_batch_size=16, shuffle=shuffle, seed=5,
                       shuffle_buffer_rows=64, columns=["id", "x"])
    assert 32 <= loader.window_rows <= 128
    ids = np.concatenate([np.asarray(b["id"]) for b in loader])
    st = loader.stats()
    assert st["rows_delivered"] == st["rows"] == len(ids) == 1000 // 16 * 16
    assert len(set(ids.tolist())) == len(ids)  # each row once
    if not shuffle:
        np.testing.assert_array_equal(ids, np.arange(len(ids)))
    assert st["rows_delivered"] <= st["rows_decoded"] <= 1.1 * st["rows_delivered"], st
    # Bounded memory: a 450-row row group is never decoded whole.
    assert 0 < st["rows_decoded_peak"] <= loader.window_rows, st


def test_stats_state_what_the_reader_and_prefetch_may_hold(jax_cpu, datasets, monkeypatch):
    """stats() states the bytes the local reader may hold ahead (2 x read_ahead + 1
    windows of decoded rows) and the prefetched batches' bytes, from the settings
    and the delivered row size (benchmarks/loader.py bounds peak RSS by twice their
    sum); the decoded rows one read held stay within one window."""
    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader import _jaxloader

    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", 64 * 20)
    loader = JaxLoader(datasets["pyarrow"], global_batch_size=16, columns=["id", "x"],
                       local_read_ahead=3, prefetch=2)
    batches = list(loader)
    row = sum(np.asarray(a).dtype.itemsize * int(np.prod(a.shape[1:]))
              for a in batches[0].values())
    assert row == 4 + 4 * 4
    st = loader.stats()
    assert st["read_ahead_bytes_max"] == (2 * 3 + 1) * loader.window_rows * row, st
    assert st["prefetch_bytes_max"] == 2 * loader.local_batch_size * row, st
    assert 0 < st["rows_decoded_peak"] * row <= st["read_ahead_bytes_max"], st


def test_host_copies_count_shuffle_take_and_object_store_puts(ray_cluster, jax_cpu, datasets):
    """host_copies counts the window permutation (one copy per column per window)
    and reader="ray"'s put of each window into the object store."""
    from slicefeed.pipelines import JaxLoader

    uri = datasets["pyarrow"]
    kw = {"global_batch_size": 16, "shuffle_buffer_rows": 64, "columns": ["id", "x"]}
    plain = JaxLoader(uri, **kw)
    list(plain)
    assert plain.stats()["host_copies"] <= 2 * 2  # batches crossing a file boundary
    shuffled = JaxLoader(uri, shuffle=True, **kw)
    list(shuffled)
    st = shuffled.stats()
    windows = -(-300 // 64) + -(-450 // 64) + -(-250 // 64)  # chunks of the 3 row groups
    assert st["host_copies"] >= 2 * windows, st
    assert st["host_copy_bytes"] >= st["rows_decoded"] * (4 + 16), st
    ray_ = JaxLoader(uri, reader="ray", **kw)
    list(ray_)
    st = ray_.stats()
    assert st["host_copies"] >= 2 * 1, st  # at least one window put, 2 columns
    assert st["host_copy_bytes"] >= st["rows"] * (4 + 16), st
    assert st["rows"] <= st["rows_decoded"] <= 1.1 * st["rows"], st


def test_write_parquet_bounds_row_groups_by_decoded_bytes(datasets):
    """Every row group of a write_parquet shard holds at most row_group_bytes of
    decoded Arrow data, and the manifest lists each file's row-group row counts."""
    from slicefeed.connectors import read_manifest

    uri = datasets["write_parquet"]
    m = read_manifest(uri)
    assert m.num_rows == 1000
    for f in m.files:
        pf = pq.ParquetFile(os.path.join(uri, f.path))
        groups = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
        assert list(f.row_groups) == groups and len(groups) > 1
        assert max(pf.read_row_group(g).nbytes for g in range(len(groups))) <= 2048


def test_row_group_bound_holds_for_uneven_rows():
    """Rows of very different sizes: the bound is measured on the rows, not the mean."""
    from slicefeed.connectors._parquet import encode_shard

    sizes = np.where(np.arange(2000) % 100 < 5, 400, 4)
    t = pa.table({"s": pa.array([b"x" * int(n) for n in sizes], pa.binary())})
    data, groups = encode_shard(t, row_group_bytes=4096)
    pf = pq.ParquetFile(io.BytesIO(data))
    assert groups == [pf.metadata.row_group(g).num_rows for g in range(len(groups))]
    assert sum(groups) == 2000
    assert max(pf.read_row_group(g).nbytes for g in range(len(groups))) <= 4096
    _, default = encode_shard(t)
    assert default == [2000]  # 64 MiB default


@pytest.mark.slow
def test_pipeline_sink_option_row_group_bytes(ray_cluster, local_dir):
    """`sink.options.row_group_bytes` reaches the shard writer of a pipeline run."""
    import json

    from slicefeed.connectors import read_manifest
    from slicefeed.pipelines import Pipeline

    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    for f in range(2):
        with open(os.path.join(raw, f"f{f}.jsonl"), "w") as fh:
            fh.writelines(json.dumps({"id": f * 100 + i}) + "\n" for i in range(100))
    out = os.path.join(local_dir, "out")
    spec = {
        "name": "rowgroups",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [{"cast": {"columns": {"id": "int32"}}}],
        "sink": {"format": "parquet", "uri": out, "options": {"row_group_bytes": 128}},
    }
    assert Pipeline(spec).run().status == "committed"
    m = read_manifest(out)
    assert m.num_rows == 200
    for f in m.files:
        pf = pq.ParquetFile(os.path.join(out, f.path))
        assert list(f.row_groups) == [
            pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
        assert len(f.row_groups) > 1
        assert max(pf.read_row_group(g).nbytes for g in range(len(f.row_groups))) <= 128


def test_state_of_the_file_window_reader_is_refused_clearly(jax_cpu, datasets):
    from slicefeed.connectors import SpecError
    from slicefeed.pipelines import JaxLoader

    loader = JaxLoader(datasets["pyarrow"], global_batch_size=16)
    next(loader)
    state = dict(loader.state_dict(), version=2)
    loader.close()
    with pytest.raises(SpecError, match=r"version 2\) was saved by an older slicefeed .* "
                                        r"another row order"):
        JaxLoader(datasets["pyarrow"], global_batch_size=16, state=state)


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_resume_inside_a_streamed_row_group_is_exact(jax_cpu, datasets, shuffle):
    """A state saved mid-way through a row group read in chunks resumes on the
    very next row (step 9 of 16-row batches with 64-row windows: inside a chunk)."""
    from slicefeed.pipelines import JaxLoader

    kw = {"global_batch_size": 16, "shuffle": shuffle, "seed": 2, "shuffle_buffer_rows": 64,
          "columns": ["id"], "num_epochs": 2}
    full = [np.asarray(b["id"]) for b in JaxLoader(datasets["pyarrow"], **kw)]
    first = JaxLoader(datasets["pyarrow"], **kw)
    for _ in range(len(full) // 2 + 9):  # into the second epoch
        next(first)
    state = first.state_dict()
    first.close()
    rest = [np.asarray(b["id"]) for b in JaxLoader(datasets["pyarrow"], state=state, **kw)]
    assert len(rest) == len(full) - (len(full) // 2 + 9)
    for a, b in zip(full[len(full) - len(rest):], rest):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_resumed_spans_stream_a_large_row_group_once(datasets, shuffle):
    """An epoch resumed on another host layout reads spans; the spans that are
    chunks of one large row group are still one stream (decoded once)."""
    import threading

    from slicefeed.pipelines._loader import _plan
    from slicefeed.pipelines._loader._sources import ManifestSource, ReadContext

    src = ManifestSource(datasets["pyarrow"], {})
    spans = _plan.host_spans(src.units, process_count=1, process_index=0, seed=1, epoch=0,
                             shuffle=shuffle, window_rows=64, limit=None)
    rest = _plan.cut_spans(spans, 40, _plan.spans_rows(spans))  # 40 rows delivered before
    counts = {"rows_decoded": 0}

    def on_read(c: dict) -> None:
        counts["rows_decoded"] += c.get("rows_decoded", 0)

    ctx = ReadContext(batch_rows=16, columns=("id",), seed=1, shuffle=shuffle,
                      shuffle_buffer_rows=64, window_rows=64, process_index=0, process_count=1,
                      reader="local", read_ahead=2, ray_prefetch_batches=1,
                      stop=threading.Event(), spans=tuple(rest), on_read=on_read)
    ids = np.concatenate([t.column("id").to_numpy() for t in src.tables(0, 0, ctx)])
    assert len(ids) == len(set(ids.tolist())) == 1000 - 40
    assert counts["rows_decoded"] <= 1.1 * len(ids), counts


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_windows_of_several_row_groups_decode_concurrently_in_file_order(
    ray_cluster, jax_cpu, tmp_path, monkeypatch, shuffle
):
    """reader="local" decodes the consecutive whole row groups of a window
    concurrently, a chunk each (_sources._read_groups; a shuffled window's pieces
    lie apart and are read one by one); the rows, their order and every value
    are those of reader="ray", which decodes them one after the other (64-row
    groups, 32-row batches, files of uneven sizes). No file handle is left open."""
    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader import _jaxloader, _sources
    from tests.pipelines._data import write_committed

    uri = str(tmp_path / "ds")
    n = write_committed(uri, [512, 400], row_group_size=64)
    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", 256 * 48)  # ~48 bytes per row
    kw = {"global_batch_size": 32, "shuffle": shuffle, "seed": 3, "shuffle_buffer_rows": 128,
          "num_epochs": 2}
    calls = []
    read_groups = _sources._read_groups

    def spy(pf, idx, columns, source, batch_rows):
        calls.append((len(idx), source is not None))
        return read_groups(pf, idx, columns, source, batch_rows)

    monkeypatch.setattr(_sources, "_read_groups", spy)
    fds = len(os.listdir("/proc/self/fd"))
    local = JaxLoader(uri, reader="local", **kw)
    assert local.window_rows >= 128  # several 64-row groups per window
    got = [{k: np.asarray(v) for k, v in b.items()} for b in local]
    local.close()
    assert shuffle or any(k >= 2 and concurrent for k, concurrent in calls), calls
    assert len(os.listdir("/proc/self/fd")) <= fds
    calls.clear()
    want = [{k: np.asarray(v) for k, v in b.items()} for b in JaxLoader(uri, reader="ray", **kw)]
    assert not any(concurrent for _, concurrent in calls)
    assert len(got) == len(want) == 2 * (n // 32)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    ids = np.concatenate([b["id"] for b in got[: n // 32]])
    if not shuffle:
        np.testing.assert_array_equal(ids, np.arange(len(ids)))
    assert len(set(ids.tolist())) == len(ids)


def _wait_for(pred, timeout_s: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_next_epoch_is_read_while_the_last_windows_are_delivered(
    ray_cluster, jax_cpu, tmp_path, monkeypatch, shuffle
):
    """With reader="local", as the readers of an epoch run out of windows the next
    epoch's runs take their places (at most read_ahead in flight), so a new epoch
    does not begin with every reader idle: its first windows are decoded while
    the last batches of the previous epoch are delivered (prefetch=0: nothing
    else reads ahead). The last epoch starts no further reads, and the rows, their
    order and values are reader="ray"'s, which reads each epoch when it begins."""
    from slicefeed.connectors import read_manifest
    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader import _jaxloader
    from tests.pipelines._data import write_committed

    uri = str(tmp_path / "ds")
    n = write_committed(uri, [256, 256], row_group_size=64)
    m = read_manifest(uri)
    row_bytes = sum(f.num_bytes for f in m.files) / n
    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", int(64 * row_bytes) - 1)
    kw = {"global_batch_size": 32, "shuffle": shuffle, "seed": 3, "shuffle_buffer_rows": 64,
          "prefetch": 0, "local_read_ahead": 2}
    loader = JaxLoader(uri, num_epochs=2, **kw)
    assert loader.window_rows == 64
    steps = n // 32
    it = iter(loader)
    got = [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(steps)]
    # Epoch 0 is delivered; epoch 1's first runs (a window each) are being read.
    assert _wait_for(lambda: loader.stats()["rows_decoded"] >= n + 2 * 64), loader.stats()
    assert loader.stats()["rows_decoded"] == n + 2 * 64  # read_ahead runs, no more
    got += [{k: np.asarray(v) for k, v in b.items()} for b in it]
    st = loader.stats()
    assert st["rows_decoded"] == 2 * n, st  # no third epoch read ahead
    want = [{k: np.asarray(v) for k, v in b.items()}
            for b in JaxLoader(uri, num_epochs=2, reader="ray", **kw)]
    assert len(got) == len(want) == 2 * steps
    for a, b in zip(got, want):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_close_while_the_next_epoch_is_read_ahead_leaves_no_reader(
    jax_cpu, tmp_path, monkeypatch
):
    """Closing the loader at an epoch's end, while the next epoch's runs are being
    read ahead and before any of its batches was asked for, stops those readers
    and closes their files."""
    import threading

    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._data import write_committed

    uri = str(tmp_path / "ds")
    n = write_committed(uri, [256, 256], row_group_size=64)
    fds = len(os.listdir("/proc/self/fd"))
    loader = JaxLoader(uri, global_batch_size=32, num_epochs=None, prefetch=0)
    it = iter(loader)
    for _ in range(n // 32):
        next(it)
    assert _wait_for(lambda: loader.stats()["rows_decoded"] > n), loader.stats()
    loader.close()

    def readers() -> list[str]:  # the process's shared decoding threads stay
        return [t.name for t in threading.enumerate()
                if t.name.startswith(("slicefeed-read", "slicefeed-jaxloader"))]

    assert _wait_for(lambda: not readers()), readers()
    assert _wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds)
