"""JaxLoader over a committed dataset: reader="local" (in-process windows, the default)
against reader="ray" (one Ray Data task per window): same batches, bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from slicefeed.connectors import SpecError
from tests.pipelines._data import write_committed

SIZES = [30, 45, 17, 50]  # 142 rows, 4 files, row groups of 7 rows


@pytest.fixture
def committed(local_dir):
    uri = os.path.join(local_dir, "committed")
    return uri, write_committed(uri, SIZES)


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of ~20 rows (rows are 48 bytes) so batches span windows and files."""
    from slicefeed.pipelines._loader import _jaxloader

    monkeypatch.setattr(_jaxloader, "WINDOW_TARGET_BYTES", 48 * 20)


def _collect(loader):
    out = []
    for b in loader:
        out.append({k: np.asarray(v) for k, v in b.items()})
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"remainder": "pad"},
        {"shuffle": True, "seed": 3, "shuffle_buffer_rows": 24},
    ],
    ids=["drop", "pad", "shuffle"],
)
def test_local_and_ray_readers_yield_identical_batches(
    ray_cluster, jax_cpu, committed, small_windows, kw
):
    from slicefeed.pipelines import JaxLoader

    uri, n = committed
    local = JaxLoader(uri, global_batch_size=16, reader="local", **kw)
    ray_ = JaxLoader(uri, global_batch_size=16, reader="ray", **kw)
    assert local.window_rows == ray_.window_rows and local.window_rows < n
    a, b = _collect(local), _collect(ray_)
    assert len(a) == len(b) == local.steps_per_epoch
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
    ids = np.concatenate([x["id"][x["mask"]] if "mask" in x else x["id"] for x in a])
    if not kw:  # file order, no shuffle: ids 0.. in order, the partial batch dropped
        np.testing.assert_array_equal(ids, np.arange(len(ids)))
        assert len(ids) == n // 16 * 16
    if kw.get("remainder") == "pad":
        assert sorted(ids.tolist()) == list(range(n))
    assert local.stats()["rows"] == ray_.stats()["rows"]


def test_local_reader_views_window_buffers(jax_cpu, committed):
    """Batches inside one window are views of the decoded Parquet buffers (no Ray needed)."""
    from slicefeed.pipelines import JaxLoader

    uri, n = committed
    loader = JaxLoader(uri, global_batch_size=8, columns=["id", "x"])
    batches = _collect(loader)
    assert len(batches) == n // 8
    st = loader.stats()
    # Windows here hold the whole share, so only batches spanning two files are
    # concatenated (files of 30, 45, 17, 50 rows: 3 of the 17 batches cross a boundary,
    # 2 columns each), plus 1: the final partial batch is padded before it is dropped.
    assert st["host_copies"] <= 2 * 3 + 1, st
    assert st["host_copy_batches"] >= len(batches)  # + the partial batch, collated then dropped


def test_reader_argument_is_validated(jax_cpu, committed):
    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    with pytest.raises(SpecError, match=r"reader must be 'local' or 'ray', got 'threads'"):
        JaxLoader(uri, global_batch_size=8, reader="threads")
    with pytest.raises(SpecError, match=r"local_read_ahead must be >= 1, got 0"):
        JaxLoader(uri, global_batch_size=8, local_read_ahead=0)
    # A flag given as text (a config file, a command line) was bool()'d, so
    # shuffle="false" shuffled.
    for name, bad in (("shuffle", "false"), ("host_local", "no"), ("shuffle", 0)):
        with pytest.raises(SpecError, match=rf"{name} must be True or False, got {bad!r}"):
            JaxLoader(uri, global_batch_size=8, **{name: bad})


def test_local_reader_close_midway_stops_reading(jax_cpu, committed, small_windows):
    import threading
    import time

    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    before = set(threading.enumerate())  # loaders of earlier tests may still be alive

    def ours():
        return [
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith("slicefeed-") and t.is_alive()
        ]

    loader = JaxLoader(uri, global_batch_size=8, num_epochs=None, prefetch=2)
    next(loader)
    assert ours(), "expected the prefetch and read threads to be running"
    loader.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and ours():
        time.sleep(0.05)
    assert not ours(), ours()
