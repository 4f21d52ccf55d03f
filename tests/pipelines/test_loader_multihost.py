"""Two OS processes x 4 CPU devices joined by jax.distributed (gloo): equal steps,
no hang, every row delivered exactly once per epoch or counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._harness import free_port
from tests.pipelines.conftest import run_worker, wait_all


@pytest.mark.slow
@pytest.mark.timeout(660)  # above wait_all's bound, which kills the workers
def test_two_hosts_unequal_shards(committed, ray_address, tmp_path):
    uri, n = committed
    sizes = [37, 61]  # each host's own Dataset: different sizes
    long_sizes = [8 * 40 + 3, 8 * 46 + 5]  # unknown counts, many steps: agreed in groups
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
            "long_sizes": long_sizes,
            "out": out,
        }
        procs.append(
            run_worker(
                "_multihost_worker.py",
                cfg,
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
            )
        )
    # Under a minute on an idle machine; the bound is for a loaded 2-core CI runner.
    # A worker still running after 540 s prints its threads' stacks first (worker).
    wait_all(procs, timeout=600)
    reports = [json.loads(Path(o).read_text()) for o in outs]
    totals = {"uri": n, "known": sum(sizes), "unknown": sum(sizes), "long": sum(long_sizes)}
    for case in reports[0]:
        kind, remainder = case.split("-")
        r0, r1 = reports[0][case], reports[1][case]
        # same number of steps on both hosts, and the same jitted global results
        assert len(r0["sums"]) == len(r1["sums"]) > 0, case
        assert r0["sums"] == r1["sums"], case
        assert r0["steps_per_epoch"] == r1["steps_per_epoch"]
        if kind in ("unknown", "long"):
            assert r0["steps_per_epoch"] is None
        # Steps are agreed per group through the key-value store, not per step,
        # also where every host knows the steps (a conversion may still fail).
        agreed = r0["stats"]["agreements"]
        assert agreed == r1["stats"]["agreements"] > 0, case
        assert agreed < len(r0["sums"]), (case, agreed, len(r0["sums"]))
        if kind == "long":
            assert 4 * agreed < len(r0["sums"]), (case, agreed, len(r0["sums"]))
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
    assert len(reports[0]["long-pad"]["sums"]) == 2 * -(-long_sizes[1] // 8)
    assert len(reports[0]["long-drop"]["sums"]) == 2 * (long_sizes[0] // 8)
    meshes = [json.loads(Path(o + ".mesh.json").read_text()) for o in outs]
    rows = [m["across"]["rows"] for m in meshes]
    assert len(rows[0]) == len(rows[1]) == 8 and not set(rows[0]) & set(rows[1]), meshes
    for m in meshes:
        for name in ("within", "unsharded"):
            assert m[name]["error"].startswith("SpecError: JaxLoader: the batch axes of "
                                               "partition_spec"), m
            assert "put 16 of the 16 rows of each batch on this host's devices" in m[name]["error"]
    errs = [json.loads(Path(o + ".error.json").read_text()) for o in outs]
    # A read error on host 0 ends both hosts after the same steps; host 1's error
    # names host 0 (and its error, once host 0 got as far as an exchange).
    fail0, fail1 = errs[0]["fail"], errs[1]["fail"]
    assert fail0["steps"] == fail1["steps"], errs
    assert "bad row" in (fail0["error"] or ""), errs
    e1 = fail1["error"] or ""
    assert "host 0" in e1, errs
    assert (e1.startswith("RuntimeError") and "host 0 failed" in e1 and "bad row" in e1) or (
        fail0["steps"] == 0 and e1.startswith("TimeoutError")), errs
    # A value only host 1 cannot convert (known steps): host 0 stops with it.
    conv0, conv1 = errs[0]["convert"], errs[1]["convert"]
    assert conv0["steps"] == conv1["steps"] > 0, errs
    assert (conv1["error"] or "").startswith("SpecError") and "'id'" in conv1["error"], errs
    e0 = conv0["error"] or ""
    assert e0.startswith("RuntimeError") and "host 1 failed" in e0 and "'id'" in e0, errs
    # A host arriving after another gave up waiting for it takes no step alone.
    late0, late1 = errs[0]["late"], errs[1]["late"]
    assert late0["steps"] == late1["steps"] == 0, errs
    for e in (late0["error"], late1["error"]):
        assert (e or "").startswith("TimeoutError") and "host 1 did not report" in e, errs


@pytest.mark.slow
@pytest.mark.timeout(660)  # above wait_all's bound, which kills the workers
def test_close_returns_while_an_exchange_waits(ray_address, tmp_path):
    """close() returns at once (about 0.5 s) while the prefetch thread waits for a host
    that never reports, and the thread ends soon after, not at the exchange's
    timeout (the key-value wait is in slices; a blocking get cannot be interrupted)."""
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
    wait_all(procs, timeout=600)  # seconds on an idle machine; bound for a loaded one
    r = json.loads(Path(out).read_text())
    # Far below the exchange's 20 s timeout (about 0.5 s on an idle machine):
    # close() did not wait for it; generous for a loaded 2-core machine.
    assert r["close_s"] < 5.0, r
    assert r["consumer_returned"] and r["next"] == "StopIteration", r
    assert r["threads_left"] == [], r


@pytest.mark.slow
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


@pytest.mark.slow
def test_elastic_resume_on_other_host_counts(committed, tmp_path):
    """A state saved on H hosts resumes on H' hosts (2 -> 1, 1 -> 2, 2 -> 3; with
    and without shuffle; "pad" and "drop"): the rows the old hosts delivered plus
    the rows the new hosts deliver are every row of the epoch exactly once
    ("drop": none twice, fewer than a batch left out), the new hosts take equal
    steps, and the next epoch is every row once on the new hosts. A global batch
    the new host count cannot split is a SpecError at construction."""
    uri, n = committed
    gbs = 12  # 2 CPU devices per host: splits over 1, 2 and 3 hosts
    steps_before = {1: 3, 2: 4}  # stop inside a shuffle window (18 or 24 rows)
    cases = {}
    for src, dst in ((2, 1), (1, 2), (2, 3)):
        for shuffle in (False, True):
            for remainder in ("pad", "drop"):
                cases[f"{src}to{dst}-{'shuffle' if shuffle else 'ordered'}-{remainder}"] = {
                    "src": src, "dst": dst, "steps": steps_before[src],
                    "kwargs": {"global_batch_size": gbs, "num_epochs": 2, "seed": 5,
                               "shuffle": shuffle, "remainder": remainder,
                               "shuffle_buffer_rows": 18},
                }
    cases["2to3-unsplittable"] = {"src": 2, "dst": 3, "steps": 1,
                                  "kwargs": {"global_batch_size": 16, "num_epochs": 1}}

    def run_phase(phase: str, key: str) -> None:
        procs = []
        for hosts in sorted({c[key] for c in cases.values()}):
            mine = {k: c for k, c in cases.items() if c[key] == hosts}
            port = free_port()
            procs += [
                run_worker(
                    "_elastic_worker.py",
                    {"coordinator": f"127.0.0.1:{port}", "process_id": pid,
                     "num_processes": hosts, "uri": uri, "phase": phase, "cases": mine,
                     "dir": str(tmp_path)},
                    env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
                )
                for pid in range(hosts)
            ]
        wait_all(procs, timeout=300)

    run_phase("before", "src")
    run_phase("after", "dst")

    def reports(phase, hosts):
        return [json.loads((tmp_path / f"{phase}.{hosts}.{h}.json").read_text())
                for h in range(hosts)]

    for name, c in cases.items():
        src, dst = c["src"], c["dst"]
        states = [(tmp_path / f"{name}.state.{h}.json").read_text() for h in range(src)]
        assert len(set(states)) == 1, f"{name}: hosts saved different states"
        assert json.loads(states[0])["hosts"]["process_count"] == src
        before = [r[name] for r in reports("before", src)]
        after = [r[name] for r in reports("after", dst)]
        if name == "2to3-unsplittable":
            for r in after:
                err = r.get("error", "")
                assert err.startswith("SpecError") and "global_batch_size (16)" in err, err
                assert "saved on 2 host(s)" in err, err
            continue
        assert all("error" not in r for r in after), (name, after)
        assert len({r["batches"] for r in after}) == 1, f"{name}: unequal steps on new hosts"
        lb = gbs // dst
        for epoch in ("0", "1"):
            ids = [i for r in after for i in r["epochs"].get(epoch, [])]
            if epoch == "0":
                ids += [i for r in before for i in r["epochs"]["0"]]
            assert len(ids) == len(set(ids)), f"{name} epoch {epoch}: a row delivered twice"
            assert set(ids) <= set(range(n)), name
            if c["kwargs"]["remainder"] == "pad":
                assert sorted(ids) == list(range(n)), f"{name} epoch {epoch}"
            else:
                assert n - len(ids) < dst * lb, (name, epoch, n - len(ids))


@pytest.mark.slow
def test_hosts_read_one_version_when_a_commit_lands_between_them(local_dir, tmp_path):
    """Each host opened the dataset's current version by itself: a version
    committed between two hosts' opens (a nightly overwrite while a job
    starts) gave one host 2 steps of version 1 and the other 3 of version 2,
    rows of both lost, and a collective one host never joins. The hosts read
    the newest version any of them opened."""
    import dataclasses
    import time

    from slicefeed.connectors import read_manifest, resolve_filesystem
    from slicefeed.connectors._manifest import version_name
    from tests.pipelines._data import write_committed

    uri = str(tmp_path / "data")
    write_committed(uri, [8])
    newer = str(tmp_path / "newer")
    write_committed(newer, [12])
    port = free_port()
    procs = [run_worker("_version_worker.py", {"coordinator": f"127.0.0.1:{port}",
                                               "process_id": pid, "uri": uri,
                                               "dir": str(tmp_path)},
                        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
             for pid in range(2)]
    deadline = time.monotonic() + 120
    while not (tmp_path / "opening").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
            [p.communicate()[0][-2000:] for p in procs if p.poll() is not None])
        time.sleep(0.05)
    time.sleep(3)  # host 0 has read version 1's manifest
    # Version 2: 12 other rows (ids 0..11 again, files of another name).
    m = read_manifest(newer)
    root = resolve_filesystem(uri)
    files = []
    for f in m.files:
        name = "v2-" + f.path
        root.fs.pipe_file(root.join(name).path, (Path(newer) / f.path).read_bytes())
        files.append(dataclasses.replace(f, path=name))
    v2 = dataclasses.replace(m, files=tuple(files), version=2, parent=1)
    root.fs.pipe_file(root.join(version_name(2)).path, v2.to_json().encode())
    (tmp_path / "committed").touch()
    wait_all(procs, timeout=300)
    r0, r1 = (json.loads((tmp_path / f"host{h}.json").read_text()) for h in range(2))
    assert r0["version"] == r1["version"] == 2, (r0, r1)
    assert r0["steps"] == r1["steps"] == 3
    assert sorted(r0["ids"] + r1["ids"]) == list(range(12))
