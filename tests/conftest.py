"""Shared fixtures: a real local Ray cluster, a real GCS emulator, 8 JAX CPU devices.

- ``gcs``: a ``gcp-storage-emulator`` server on a free loopback port (session);
  ``STORAGE_EMULATOR_HOST`` points gcsfs at it, in this process and in the Ray
  workers started after it.
- ``ray_cluster``: ``ray.init(address="local", num_cpus=2)`` once per session;
  ``slicefeed`` CLI subprocesses started with ``run_slicefeed`` join it.
- ``base_uri``: parametrised over ``local`` and ``gcs``: a fresh empty prefix
  whose path contains spaces, on local disk or in a fresh emulator bucket.
"""

from __future__ import annotations

import os
import uuid

from tests._harness import SESSION_RAY_ENV, GCSEmulator, configure_process_env

configure_process_env()

import pytest

_EMULATOR: GCSEmulator | None = None


def _emulator() -> GCSEmulator:
    # Started at most once per session, before Ray, so Ray workers inherit
    # STORAGE_EMULATOR_HOST.
    global _EMULATOR
    if _EMULATOR is None:
        _EMULATOR = GCSEmulator().start()
        os.environ["STORAGE_EMULATOR_HOST"] = _EMULATOR.endpoint
    return _EMULATOR


def pytest_sessionfinish(session, exitstatus):
    if _EMULATOR is not None:
        _EMULATOR.stop()


def pytest_collection_modifyitems(config, items):
    # The simulated slice cluster (``slice_cluster``, session-scoped: about
    # 30 Ray processes) lives from the first slice test to the end of the
    # session; running the slice tests last keeps it from taking CPU from
    # every test collected after the first of them.
    items.sort(key=lambda item: item.get_closest_marker("slice") is not None)


@pytest.fixture(scope="session")
def gcs() -> GCSEmulator:
    """The session's GCS emulator server."""
    return _emulator()


@pytest.fixture(scope="session")
def ray_cluster(gcs):
    """A real local Ray cluster shared by the session (2 CPUs, like CI)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=1 << 30,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    # CLI subprocesses join this cluster (tests._harness.run_slicefeed).
    os.environ[SESSION_RAY_ENV] = ray.get_runtime_context().gcs_address
    yield ray
    os.environ.pop(SESSION_RAY_ENV, None)
    ray.shutdown()


@pytest.fixture
def bucket(gcs) -> str:
    """A fresh, empty bucket on the emulator."""
    name = f"sf-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture
def local_dir(tmp_path) -> str:
    """A fresh local directory whose path contains spaces."""
    d = tmp_path / "with spaces" / "data set"
    d.mkdir(parents=True)
    return str(d)


@pytest.fixture(params=["local", "gcs"])
def base_uri(request, tmp_path) -> str:
    """A fresh empty prefix with spaces in it, on local disk or the GCS emulator."""
    if request.param == "local":
        d = tmp_path / "with spaces" / "data set"
        d.mkdir(parents=True)
        return str(d)
    gcs = request.getfixturevalue("gcs")
    name = f"sf-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    return f"gs://{name}/with spaces/data set"


@pytest.fixture(scope="session")
def jax_cpu():
    """JAX with 8 CPU devices (XLA_FLAGS is set before jax is imported)."""
    import jax

    assert jax.device_count() == 8, (
        f"expected 8 CPU devices, got {jax.device_count()}: XLA_FLAGS must be set "
        "before jax is imported"
    )
    return jax
