"""Fixtures for the loader tests (tiny committed datasets, subprocess helpers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)

from _data import write_committed  # noqa: E402

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
    """Runs ``tests/pipelines/<script>`` with ``config`` as JSON argv[1]; returns Popen."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, script), json.dumps(config)],
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
