"""JaxLoader sources: a slicefeed Pipeline runs once per epoch (its schema is static)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest


@pytest.fixture(scope="module")
def env(ray_cluster, jax_cpu):
    return jax_cpu


def test_pipeline_source_runs_once_per_epoch(env, tmp_path):
    import tests.pipelines._count_transform  # noqa: F401 - registers test_count
    from slicefeed.pipelines import JaxLoader, Pipeline

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "f0.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(16))
    )
    calls = tmp_path / "calls"
    calls.mkdir()
    spec = {
        "name": "count",
        "source": {"format": "jsonl", "uri": str(raw)},
        "transforms": [
            {"test_count": {"dir": str(calls)}},
            {"cast": {"columns": {"id": "int32"}}},
            {"select": {"columns": ["id"]}},
        ],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
    }
    p = Pipeline(spec)
    p.dataset().materialize()
    per_run = len(os.listdir(calls))
    assert per_run >= 1
    for f in os.listdir(calls):
        os.remove(calls / f)

    loader = JaxLoader(p, global_batch_size=8, num_epochs=2)
    assert len(os.listdir(calls)) == 0, "building the loader ran the pipeline"
    ids = [np.asarray(b["id"]).tolist() for b in loader]
    assert sorted(i for b in ids for i in b) == sorted(list(range(16)) * 2)
    assert len(os.listdir(calls)) == 2 * per_run, "the pipeline ran more than once per epoch"


def test_iterator_source_runs_pipeline_once_per_epoch(env, tmp_path):
    """A DataIterator (what ray.train.get_dataset_shard returns) has no static schema;
    asking Ray for it executes the pipeline up to its first block once more."""
    import tests.pipelines._count_transform  # noqa: F401 - registers test_count
    from slicefeed.pipelines import JaxLoader, Pipeline

    raw = tmp_path / "raw"
    raw.mkdir()
    for f in range(2):
        (raw / f"f{f}.jsonl").write_text("".join(
            json.dumps({"id": f * 20 + i}) + "\n" for i in range(20)))
    calls = tmp_path / "calls"
    calls.mkdir()
    spec = {
        "name": "count",
        "source": {"format": "jsonl", "uri": str(raw)},
        "transforms": [{"test_count": {"dir": str(calls)}},
                       {"cast": {"columns": {"id": "int32"}}}],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
    }
    p = Pipeline(spec)
    p.dataset().materialize()
    per_run = len(os.listdir(calls))
    for f in os.listdir(calls):
        os.remove(calls / f)

    (it,) = p.dataset().streaming_split(1, equal=True)
    loader = JaxLoader(it, global_batch_size=8, num_epochs=2, remainder="pad")
    ids = [np.asarray(b["id"])[np.asarray(b["mask"])].tolist() for b in loader]
    assert len(ids) == 10 and all(len(b) == 8 for b in ids)
    assert sorted(i for b in ids for i in b) == sorted(list(range(40)) * 2)
    assert len(os.listdir(calls)) == 2 * per_run, "the pipeline ran more than once per epoch"
