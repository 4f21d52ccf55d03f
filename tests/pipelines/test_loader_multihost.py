"""Two OS processes x 4 CPU devices joined by jax.distributed (gloo): equal steps,
no hang, every row delivered exactly once per epoch or counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._harness import free_port
from tests.pipelines.conftest import run_worker, wait_all


@pytest.mark.slow
def test_two_hosts_unequal_shards(committed, ray_address, tmp_path):
    uri, n = committed
    sizes = [37, 61]  # each host's own Dataset: different sizes
    port = free_port()
    procs, outs = [], []
    for pid in range(2):
        out = str(tmp_path / f"host{pid}.json")
        outs.append(out)
        cfg = {
            "coordinator": f"127.0.0.1:{port}",
            "process_id": pid,
            "num_processes": 2,
            "address": ray_address,
            "uri": uri,
            "sizes": sizes,
            "out": out,
        }
        procs.append(
            run_worker(
                "_multihost_worker.py",
                cfg,
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
            )
        )
    wait_all(procs, timeout=240)
    reports = [json.loads(Path(o).read_text()) for o in outs]
    totals = {"uri": n, "known": sum(sizes), "unknown": sum(sizes)}
    for case in reports[0]:
        kind, remainder = case.split("-")
        r0, r1 = reports[0][case], reports[1][case]
        # same number of steps on both hosts, and the same jitted global results
        assert len(r0["sums"]) == len(r1["sums"]) > 0, case
        assert r0["sums"] == r1["sums"], case
        assert r0["steps_per_epoch"] == r1["steps_per_epoch"]
        if kind == "unknown":
            assert r0["steps_per_epoch"] is None
        for epoch in ("0", "1"):
            ids = [i for r in (r0, r1) for batch in r["epochs"][epoch] for i in batch]
            assert len(ids) == len(set(ids)), f"{case}: a row was delivered twice"
            assert set(ids) <= set(range(totals[kind]))
            if remainder == "pad":
                assert sorted(ids) == list(range(totals[kind])), case
            # per epoch: the jitted sum over global arrays equals the delivered ids
        dropped = r0["stats"]["dropped_rows"] + r1["stats"]["dropped_rows"]
        delivered = r0["stats"]["rows"] + r1["stats"]["rows"]
        assert delivered + dropped == 2 * totals[kind], (case, delivered, dropped)
        assert sum(s[0] for s in r0["sums"]) == sum(
            i for r in (r0, r1) for e in r["epochs"].values() for b in e for i in b
        )
    # unequal shards: 37 vs 61 rows with 8 rows per host and step
    assert reports[0]["known-drop"]["steps_per_epoch"] == 37 // 8
    assert reports[0]["known-pad"]["steps_per_epoch"] == -(-61 // 8)
    assert len(reports[0]["unknown-pad"]["sums"]) == 2 * -(-61 // 8)
    assert len(reports[0]["unknown-drop"]["sums"]) == 2 * (37 // 8)


@pytest.mark.slow
def test_close_returns_while_an_exchange_waits(ray_address, tmp_path):
    """close() returns within a second while the prefetch thread waits for a host
    that never reports (the key-value wait polls; a blocking get cannot be interrupted)."""
    port = free_port()
    out = str(tmp_path / "close.json")
    procs = [
        run_worker(
            "_close_worker.py",
            {"coordinator": f"127.0.0.1:{port}", "process_id": pid,
             "address": ray_address, "out": out},
            env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
        )
        for pid in range(2)
    ]
    wait_all(procs, timeout=240)
    r = json.loads(Path(out).read_text())
    assert r["close_s"] < 1.0, r
    assert r["consumer_returned"] and r["next"] == "StopIteration", r
    assert r["threads_left"] == [], r


def test_pipeline_split_per_host_and_shared_dataset_refused(ray_address, tmp_path):
    """Every host passes the same Pipeline: each row once per epoch across hosts
    (split by input files); the same ray.data.Dataset on every host is refused."""
    raw = tmp_path / "raw"
    raw.mkdir()
    sizes = [7, 12, 5, 9, 11]  # 44 rows in 5 files: host 0 reads 3 files, host 1 two
    start = 0
    for f, n in enumerate(sizes):
        (raw / f"f{f}.jsonl").write_text(
            "".join(json.dumps({"id": i, "t": "x"}) + "\n" for i in range(start, start + n))
        )
        start += n
    port = free_port()
    outs = [str(tmp_path / f"split{pid}.json") for pid in range(2)]
    procs = [
        run_worker(
            "_split_worker.py",
            {"coordinator": f"127.0.0.1:{port}", "process_id": pid,
             "address": ray_address, "raw": str(raw), "out": outs[pid]},
            env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
        )
        for pid in range(2)
    ]
    wait_all(procs, timeout=300)
    r0, r1 = (json.loads(Path(o).read_text()) for o in outs)
    assert r0["steps"] == r1["steps"] > 0
    for epoch in ("0", "1"):
        ids = r0["epochs"][epoch] + r1["epochs"][epoch]
        assert sorted(ids) == list(range(sum(sizes))), epoch  # each row exactly once
    for r in (r0, r1):
        err = r["dataset_error"] or ""
        assert err.startswith("SpecError") and "2 JAX processes" in err, err
        assert "committed" in err and "Pipeline" in err and "get_dataset_shard" in err, err
        assert "host_local=True" in err, err
