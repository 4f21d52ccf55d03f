"""Loader state saved with the train state through Orbax; restored in a fresh process,
the next batches are identical."""

from __future__ import annotations

import json

import pytest

from tests.pipelines._conformance import digests
from tests.pipelines.conftest import run_worker, wait_all

pytest.importorskip("orbax.checkpoint")


def _lines(out: str, prefix: str) -> str:
    return [ln for ln in out.splitlines() if ln.startswith(prefix)][-1][len(prefix):]


@pytest.mark.slow
def test_orbax_save_and_restore_in_fresh_process(jax_cpu, committed, tmp_path):
    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    kw = {"global_batch_size": 16, "num_epochs": 2, "shuffle": True, "seed": 9, "shuffle_buffer_rows": 32}
    ref = digests(JaxLoader(uri, **kw))
    take = len(ref) // 2 + 1  # inside the second epoch
    cfg = {"uri": uri, "ckpt": str(tmp_path / "ckpt"), "kwargs": kw, "take": take}
    saved = wait_all([run_worker("_orbax_worker.py", {**cfg, "mode": "save"})], timeout=180)[0]
    restored = wait_all([run_worker("_orbax_worker.py", {**cfg, "mode": "restore"})],
                        timeout=180)[0]
    assert json.loads(_lines(saved, "DIGESTS ")) == ref[take:]
    assert json.loads(_lines(restored, "DIGESTS ")) == ref[take:]
    assert _lines(saved, "W ") == _lines(restored, "W ")  # the train state came back too


def test_orbax_restore_on_another_process_count(jax_cpu, committed, tmp_path):
    """A checkpoint saved by 2 processes (``process_*-of-2.json``) restores on 1:
    every process saved the same state, so any file is used."""
    import pathlib

    from slicefeed.pipelines import JaxLoader, JaxLoaderRestore, JaxLoaderSave
    from slicefeed.pipelines._loader._orbax import JaxLoaderCheckpointHandler

    uri, _ = committed
    kw = {"global_batch_size": 16, "shuffle": True, "seed": 2, "shuffle_buffer_rows": 32}
    ref = digests(JaxLoader(uri, **kw))
    a = JaxLoader(uri, **kw)
    digests(a, limit=3)
    ckpt = pathlib.Path(tmp_path / "loader")
    JaxLoaderCheckpointHandler().save(ckpt, args=JaxLoaderSave(a))
    (own,) = ckpt.iterdir()
    for h in range(2):  # as two processes would have saved it
        (ckpt / f"process_{h}-of-2.json").write_text(own.read_text())
    own.unlink()
    b = JaxLoader(uri, **kw)
    JaxLoaderCheckpointHandler().restore(ckpt, args=JaxLoaderRestore(b))
    assert digests(b) == ref[3:]
