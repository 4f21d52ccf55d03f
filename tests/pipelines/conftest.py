"""Fixtures for tests/pipelines: a simulated TPU v6e cluster (``-m slice``).

``slice_cluster`` (session-scoped, started on first use, ~15 s on an idle
machine): a Ray cluster on loopback made of separate OS processes

- ``head``: 0 CPUs (like a KubeRay head: nothing is scheduled on it);
- ``cpu-0``: a CPU-only worker node, 2 CPUs, no TPU resource or labels;
- ``slice-a``: a full v6e ``4x4`` slice, 4 hosts x (``TPU: 4``, 1 CPU);
- ``slice-b``: an incomplete v6e ``4x4`` slice, hosts 0-2 only (host 3 "lost").

Tests talk to it through driver subprocesses (``cluster.driver_env()`` sets
``RAY_ADDRESS``), never via ``ray.init`` in the pytest process, which may
already hold the session ``ray_cluster``. See ``docs/CONTRIBUTING-slice.md``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from _slice_cluster import SimulatedCluster  # noqa: E402

FULL_SLICE = "slice-a"
INCOMPLETE_SLICE = "slice-b"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slice: runs on the simulated multi-host TPU cluster (slice_cluster fixture; "
        "~15 s start, ~3.5 GB peak). Select with -m slice, skip with -m 'not slice'.",
    )


def pytest_collection_modifyitems(config, items):
    # The first `slice` test also pays for starting the cluster (~15 s idle,
    # minutes on a loaded shared machine): give these tests more than the
    # suite's default per-test timeout unless they set their own.
    for item in items:
        if item.get_closest_marker("slice") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


@pytest.fixture(scope="session")
def slice_cluster(gcs):
    """Head + CPU node + full v6e 4x4 slice + incomplete 3-host slice, on loopback.

    Depends on ``gcs`` so that every node (and so every Ray worker) inherits
    ``STORAGE_EMULATOR_HOST``.
    """
    cluster = SimulatedCluster()
    try:
        cluster.start_head(num_cpus=0)
        cluster.add_cpu_node("cpu-0", num_cpus=2)
        cluster.add_slice(FULL_SLICE, topology="4x4", accelerator="v6e")
        cluster.add_slice(INCOMPLETE_SLICE, topology="4x4", accelerator="v6e", worker_ids=[0, 1, 2])
        cluster.wait_for_nodes()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()
