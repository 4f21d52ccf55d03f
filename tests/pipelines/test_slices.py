"""``slicefeed slices`` against the simulated cluster (one full, one incomplete slice)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slicefeed.pipelines._ops.slices import SliceInfo, format_table, list_slices

# `slicefeed slices` through the real CLI entry point (independent of PATH).
SLICES = [sys.executable, "-m", "slicefeed.pipelines._ops.cli", "slices"]


def _run(cluster, *args, timeout=120):
    return subprocess.run(
        [*SLICES, *args],
        env=cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slice
def test_table_lists_full_and_incomplete_slice(slice_cluster):
    proc = _run(slice_cluster, "--address", slice_cluster.address)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["SLICE", "ACCELERATOR", "TOPOLOGY", "POD", "TYPE", "HOSTS", "STATE"]
    assert lines[1].split() == ["slice-a", "TPU-V6E", "4x4", "v6e-16", "4/4", "free"]
    assert lines[2].split() == [
        "slice-b", "TPU-V6E", "4x4", "v6e-16", "3/4", "INCOMPLETE", "(missing", "worker", "3)"
    ]
    assert "warning: slice 'slice-b' is incomplete (3 of 4 hosts)" in proc.stdout
    assert "waits and retries without an error" in proc.stdout
    assert "slice-a' is incomplete" not in proc.stdout


@pytest.mark.slice
def test_json_and_fail_on_incomplete(slice_cluster):
    proc = _run(slice_cluster, "--address", slice_cluster.address, "--json", "--fail-on-incomplete")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["incomplete"] == ["slice-b"]
    by_name = {s["name"]: s for s in doc["slices"]}
    assert set(by_name) == {"slice-a", "slice-b"}  # the CPU node and head are not slices
    a, b = by_name["slice-a"], by_name["slice-b"]
    assert (a["hosts_present"], a["hosts_expected"], a["worker_ids"], a["chips"]) == (4, 4, [0, 1, 2, 3], 16)
    assert a["complete"] and not a["busy"] and a["state"] == "free"
    assert (b["hosts_present"], b["hosts_expected"], b["missing_worker_ids"], b["chips"]) == (3, 4, [3], 12)
    assert not b["complete"] and b["accelerator"] == "TPU-V6E" and b["pod_type"] == "v6e-16"


@pytest.mark.slice
def test_busy_slice_is_reported(slice_cluster, tmp_path):
    # A driver holds the whole of slice-a the way JaxTrainer does (Ray's own
    # slice_placement_group), then runs the command while holding it.
    script = tmp_path / "hold.py"
    script.write_text(
        f"""
import subprocess, sys, ray
from ray.util.tpu import slice_placement_group
ray.init(log_to_driver=False, logging_level="ERROR")
# Name the slice: an untargeted reservation may pick slice-b's worker 0 and
# then wait forever for its missing host (the very hazard this command flags).
handle = slice_placement_group(
    topology="4x4", accelerator_version="v6e",
    bundle_label_selector=[{{"ray.io/tpu-slice-name": "slice-a"}}] * 4,
)
ray.get(handle.placement_group.ready(), timeout=60)
out = subprocess.run({SLICES!r} + ["--json"], capture_output=True, text=True, timeout=120)
sys.stdout.write(out.stdout); sys.stderr.write(out.stderr)
"""
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=slice_cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_name = {s["name"]: s for s in json.loads(proc.stdout)["slices"]}
    # Only the complete slice can be reserved; the incomplete one stays free.
    assert by_name["slice-a"]["state"] == "busy" and by_name["slice-a"]["busy_hosts"] == 4
    assert by_name["slice-b"]["state"] == "INCOMPLETE (missing worker 3)"


def test_unreachable_address_is_a_clear_error():
    import os

    from tests._harness import free_port

    bad = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([*SLICES, "--address", bad], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"cannot connect to the Ray cluster at '{bad}': nothing answers" in proc.stderr
    assert "Pass --address HOST:PORT" in proc.stderr


# -- pure functions (no cluster) ------------------------------------------------


def _node(node_id, slice_name, wid, *, tpu=4, head=False, pod="v6e-16", topo="4x4"):
    labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(wid),
        "ray.io/tpu-topology": topo,
        "ray.io/tpu-pod-type": pod,
        "ray.io/accelerator-type": "TPU-V6E",
    }
    resources = {"CPU": 1.0, "TPU": float(tpu)}
    if head:
        resources[f"TPU-{pod}-head"] = 1.0
    return {"NodeID": node_id, "Alive": True, "Labels": labels, "Resources": resources}


def test_missing_worker_zero_and_head_reservation():
    nodes = [_node("n1", "s", 1), _node("n2", "s", 2), _node("n3", "s", 3)]
    nodes.append({"NodeID": "dead", "Alive": False, "Labels": nodes[0]["Labels"], "Resources": {}})
    nodes.append({"NodeID": "cpu", "Alive": True, "Labels": {}, "Resources": {"CPU": 8.0}})
    [info] = list_slices(nodes, {})
    assert info.missing_worker_ids == (0,) and info.hosts_present == 3
    assert info.state == "INCOMPLETE (missing worker 0)"

    full = [_node(f"h{i}", "t", i, head=(i == 0)) for i in range(4)]
    # Worker 0's head resource reserved but no TPU taken yet: already busy.
    free = {f"h{i}": dict(full[i]["Resources"]) for i in range(4)}
    [t] = list_slices(full, free)
    assert t.complete and t.busy_hosts == 0 and t.state == "free"
    # Ray omits fully used resources from the free list.
    del free["h0"]["TPU-v6e-16-head"]
    [t] = list_slices(full, free)
    assert t.complete and t.busy_hosts == 1 and t.state == "busy"
    del free["h1"]["TPU"]
    [t] = list_slices(full, free)
    assert t.busy_hosts == 2


def test_empty_cluster_message():
    assert format_table([]).startswith("No TPU slices in this cluster")


def test_state_plural():
    info = SliceInfo("x", "TPU-V6E", "4x4", "v6e-16", 2, 4, (0, 1), (2, 3), 8, 1)
    assert info.state == "INCOMPLETE (missing workers 2, 3), busy"
