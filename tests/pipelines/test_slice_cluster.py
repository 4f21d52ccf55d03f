"""The simulated cluster harness: isolated from other Ray users, stops exactly its own processes."""

from __future__ import annotations

import os

import pytest

from tests._slice_cluster import SimulatedCluster

pytestmark = pytest.mark.slice

DEFAULT_ADDRESS_FILE = "/tmp/ray/ray_current_cluster"


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_nodes_carry_gke_tpu_identity(slice_cluster):
    nodes = slice_cluster.alive_nodes()
    assert len(nodes) == 9  # head, cpu-0, 4 + 3 TPU hosts
    hosts = [n for n in nodes if n["labels"].get("ray.io/tpu-slice-name")]
    by_slice = {}
    for n in hosts:
        lb = n["labels"]
        assert lb["ray.io/tpu-topology"] == "4x4"
        assert lb["ray.io/tpu-pod-type"] == "v6e-16"
        assert lb["ray.io/accelerator-type"] == "TPU-V6E"
        assert n["resources"]["TPU"] == 4
        by_slice.setdefault(lb["ray.io/tpu-slice-name"], []).append(int(lb["ray.io/tpu-worker-id"]))
        # Ray's slice head resource sits on worker 0 only.
        assert ("TPU-v6e-16-head" in n["resources"]) == (lb["ray.io/tpu-worker-id"] == "0")
    assert {k: sorted(v) for k, v in by_slice.items()} == {"slice-a": [0, 1, 2, 3], "slice-b": [0, 1, 2]}
    cpu_only = [n for n in nodes if not n["resources"].get("TPU") and n["resources"].get("CPU")]
    assert len(cpu_only) == 1 and cpu_only[0]["resources"]["CPU"] == 2


def test_address_file_is_private(slice_cluster):
    # `ray start` records its address in <temp-dir>/ray_current_cluster; ours is
    # per node, never the machine-wide default a bare ray.init() would read.
    assert slice_cluster.address.split(":")[1] not in (_read(DEFAULT_ADDRESS_FILE) or "")
    own = [
        _read(os.path.join(slice_cluster.temp_dir, d, "ray_current_cluster"))
        for d in os.listdir(slice_cluster.temp_dir)
        if d[:1] == "n" and d[1:].isdigit()  # one temp dir per node: n0, n1, ...
    ]
    assert len(own) == len(slice_cluster.nodes)
    assert own and all(a and a.strip().endswith(f":{slice_cluster.head_port}") for a in own)


def test_stop_ends_exactly_its_own_processes(slice_cluster, gcs):
    before = _read(DEFAULT_ADDRESS_FILE)
    tiny = SimulatedCluster()
    try:
        tiny.start_head(num_cpus=0)
        tiny.add_slice("tiny", topology="2x2", accelerator="v6e")  # single host, TPU: 4
        nodes = tiny.wait_for_nodes()
        assert len(nodes) == 2
        [host] = [n for n in nodes if n["resources"].get("TPU")]
        assert host["resources"]["TPU"] == 4 and host["labels"]["ray.io/tpu-pod-type"] == "v6e-4"
        ours = tiny._our_pids()
        assert len(ours) >= 4  # two `ray start` processes, gcs_server, raylets, agents
        assert not set(ours) & set(slice_cluster._our_pids())
        # The other cluster's `ray start --block` processes (one per node).
        others = [n.proc.pid for n in slice_cluster.nodes]
    finally:
        tiny.stop()
    assert not [p for p in ours if _alive(p)], "processes of the stopped cluster survived"
    assert not os.path.exists(tiny.temp_dir)
    # Everything else on the machine is untouched: the session's slice cluster,
    # the GCS emulator, and the machine-wide Ray address file.
    assert all(_alive(p) for p in others)
    assert len(slice_cluster.alive_nodes()) == 9
    assert gcs.proc.poll() is None
    assert _read(DEFAULT_ADDRESS_FILE) == before
