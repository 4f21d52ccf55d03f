"""End to end on a simulated v6e 4x4 slice: pipeline -> JaxTrainer -> JaxLoader -> resume.

A slicefeed pipeline reads jsonl from the GCS emulator, casts and selects
columns, and hands the lazy Dataset to ``JaxTrainer`` with the ScalingConfig
that ``SliceSpec("4x4", "v6e")`` supplies. Ray reserves the slice through its
own TPU scheduling; each of the 4 workers is a JAX process with 4 CPU devices
(16 in all) and feeds a jitted step from ``JaxLoader(get_dataset_shard(...))``.
See ``_slice_train_driver.py`` for what runs on the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from slicefeed.connectors import resolve_filesystem

# The module fixture runs two JaxTrainer fits (~20 s each on an idle small
# machine; minutes on a loaded one): more than the suite's
# default 300 s per-test timeout allows for the first test.
pytestmark = [pytest.mark.slice, pytest.mark.timeout(1200)]

ROWS = 1000  # not a multiple of the global batch: the last steps carry padding
GLOBAL_BATCH = 64
CKPT_STEP = 5
DRIVER = os.path.join(os.path.dirname(__file__), "_slice_train_driver.py")


def _write_source(base: str) -> str:
    r = resolve_filesystem(base)
    per_file = ROWS // 4
    for f in range(4):
        lines = [
            json.dumps({"id": i, "x": i / ROWS, "y": 2.0 * i / ROWS, "note": f"row {i}"})
            for i in range(f * per_file, (f + 1) * per_file)
        ]
        r.fs.pipe_file(f"{r.path}/part-{f}.jsonl", ("\n".join(lines) + "\n").encode())
    return base


@pytest.fixture(scope="module")
def e2e(slice_cluster, gcs, tmp_path_factory):
    """Runs the driver once (two fits) and returns the per-worker records."""
    gcs.create_bucket("slice-e2e")
    source = _write_source("gs://slice-e2e/raw text")
    out = tmp_path_factory.mktemp("slice-e2e")
    proc = subprocess.run(
        [sys.executable, DRIVER, str(out), source],
        env=slice_cluster.driver_env({"RAY_TRAIN_V2_ENABLED": "1"}),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    runs = {}
    for run in ("full", "resumed"):
        recs = []
        for rank in range(4):
            with open(out / f"{run}-rank{rank}.json") as f:
                recs.append(json.load(f))
        runs[run] = recs
    with open(out / "driver.json") as f:
        runs["driver"] = json.load(f)
    runs["out"] = out
    return runs


def test_four_hosts_sixteen_devices(e2e):
    for rec in e2e["full"] + e2e["resumed"]:
        assert rec["process_count"] == 4
        assert rec["device_count"] == 16
        assert rec["local_device_count"] == 4
    # One worker per host of slice-a: four distinct Ray nodes.
    assert len({rec["node_id"] for rec in e2e["full"]}) == 4
    assert sorted(rec["process_index"] for rec in e2e["full"]) == [0, 1, 2, 3]


def test_batches_are_global_and_sharded_over_all_devices(e2e):
    for rec in e2e["full"]:
        for s in rec["steps"]:
            assert s["shape"] == [GLOBAL_BATCH]
            assert s["devices"] == 16
            assert s["local_shards"] == 4
            assert len(s["ids"]) + s["padded"] == GLOBAL_BATCH // 4
    # One compilation serves every step, the padded last ones included.
    for rec in e2e["full"] + e2e["resumed"]:
        assert rec["traces"] == 1, rec["rank"]


def test_same_steps_on_every_host(e2e):
    for run in ("full", "resumed"):
        lengths = {len(rec["steps"]) for rec in e2e[run]}
        assert len(lengths) == 1, (run, lengths)
        for rec in e2e[run]:
            assert [s["step"] for s in rec["steps"]] == [s["step"] for s in e2e[run][0]["steps"]]
    # The loss is a global reduction: every host computes the same value.
    for i in range(len(e2e["full"][0]["steps"])):
        assert len({rec["steps"][i]["loss"] for rec in e2e["full"]}) == 1


def test_every_row_exactly_once(e2e):
    counts = Counter(i for rec in e2e["full"] for s in rec["steps"] for i in s["ids"])
    assert sorted(counts) == list(range(ROWS))
    assert set(counts.values()) == {1}
    padded = sum(s["padded"] for rec in e2e["full"] for s in rec["steps"])
    steps = len(e2e["full"][0]["steps"])
    assert ROWS + padded == steps * GLOBAL_BATCH
    # The loaders' own counts agree with what the steps saw.
    assert sum(rec["rows"] for rec in e2e["full"]) == ROWS


def test_checkpoint_holds_every_hosts_loader_state(e2e):
    files = e2e["driver"]["checkpoint_files"]
    assert files == [f"loader-rank{r}.json" for r in range(4)]
    states = []
    for r in range(4):
        with open(os.path.join(e2e["driver"]["checkpoint"], f"loader-rank{r}.json")) as f:
            states.append(json.load(f))
    assert {(s["epoch"], s["step"]) for s in states} == {(0, CKPT_STEP)}


def test_resumed_fit_continues_like_the_uninterrupted_run(e2e):
    for full, resumed in zip(e2e["full"], e2e["resumed"]):
        assert full["rank"] == resumed["rank"]
        tail = [s for s in full["steps"] if s["step"] >= CKPT_STEP]
        assert [s["step"] for s in resumed["steps"]] == [s["step"] for s in tail]
        assert [s["ids"] for s in resumed["steps"]] == [s["ids"] for s in tail]
    # Together, the first CKPT_STEP steps and the resumed run cover the epoch once.
    head = [i for rec in e2e["full"] for s in rec["steps"] if s["step"] < CKPT_STEP for i in s["ids"]]
    rest = [i for rec in e2e["resumed"] for s in rec["steps"] for i in s["ids"]]
    assert sorted(head + rest) == list(range(ROWS))
