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
