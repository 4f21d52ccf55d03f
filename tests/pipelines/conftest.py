"""Fixtures for tests/pipelines.

Loader tests: ``committed`` (a tiny committed dataset written by pyarrow),
``ray_address``, and ``run_worker`` / ``wait_all`` for subprocess hosts.

``slice_cluster`` (``-m slice``; session-scoped, started on first use, ~15 s on
an idle machine): a Ray cluster on loopback made of separate OS processes

- ``head``: 0 CPUs (like a KubeRay head: nothing is scheduled on it);
- ``cpu-0``: a CPU-only worker node, 2 CPUs, no TPU resource or labels;
- ``slice-a``: a full v6e ``4x4`` slice, 4 hosts x (``TPU: 4``, 1 CPU);
- ``slice-b``: an incomplete v6e ``4x4`` slice, hosts 0-2 only (host 3 "lost").

Tests talk to it through driver subprocesses (``cluster.driver_env()`` sets
``RAY_ADDRESS``), never via ``ray.init`` in the pytest process, which may
already hold the session ``ray_cluster``. See the README's development section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._slice_cluster import SimulatedCluster
from tests.pipelines._data import write_committed

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(HERE)))

SIZES = [30, 45, 17, 50]  # 142 rows, 4 files, row groups of 7 rows


@pytest.fixture
def committed(local_dir) -> tuple[str, int]:
    """A committed dataset written by pyarrow in a path with spaces: (uri, num_rows)."""
    uri = os.path.join(local_dir, "committed")
    return uri, write_committed(uri, SIZES)


@pytest.fixture
def ray_address(ray_cluster) -> str:
    """Address of the session Ray cluster, for subprocess drivers to join."""
    return ray_cluster.get_runtime_context().gcs_address


def run_worker(script: str, config: dict, *, timeout: float = 120, env: dict | None = None):
    """Runs ``tests/pipelines/<script>`` with ``config`` as JSON argv[1]; returns Popen.

    The script runs as the module ``tests.pipelines.<name>`` with the
    repository root on ``PYTHONPATH``, so it imports the test helpers as a package.
    """
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
    module = "tests.pipelines." + os.path.splitext(script)[0]
    return subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(config)],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_all(procs, timeout: float) -> list[str]:
    """Waits for every process (killing all on timeout); returns their outputs."""
    import time

    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            left = max(deadline - time.monotonic(), 0.1)
            out, _ = p.communicate(timeout=left)
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        details = []
        for p in procs:
            try:
                details.append(p.communicate(timeout=5)[0][-3000:])
            except Exception:  # noqa: BLE001
                details.append("<no output>")
        pytest.fail(f"workers did not finish within {timeout} s (hang?):\n" + "\n---\n".join(details))
    for p, out in zip(procs, outs):
        assert p.returncode == 0, f"worker failed (rc={p.returncode}):\n{out[-5000:]}"
    return outs

FULL_SLICE = "slice-a"
INCOMPLETE_SLICE = "slice-b"



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
