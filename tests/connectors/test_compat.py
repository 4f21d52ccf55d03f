"""Every entry of slicefeed.connectors._compat against the installed Ray, JAX and gcsfs.

The private attributes were checked on the versions in ``CHECKED_VERSIONS``
(Ray 2.60.0, JAX 0.10.2, gcsfs 2026.10.1); pyproject.toml bounds Ray and JAX
below the next minor release. A failure here after an upgrade names the entry
to fix.
"""

from __future__ import annotations

from importlib import metadata

import pyarrow as pa
import pytest

from slicefeed.connectors import _compat


def test_checked_versions_are_the_installed_ones():
    for pkg, checked in _compat.CHECKED_VERSIONS.items():
        installed = metadata.version(pkg)
        assert installed.split(".")[:2] == checked.split(".")[:2], (
            f"{pkg} {installed} is installed; slicefeed.connectors._compat was checked on "
            f"{checked}. Re-check its {pkg} entries and update CHECKED_VERSIONS."
        )


def test_valid_tpu_topologies():
    table = _compat.valid_tpu_topologies()
    assert table is not None, "ray._private.accelerators.tpu.VALID_TPU_TOPOLOGY moved"
    assert "4x4" in table["v6e"] and "2x2x2" in table["v4"] and "2x2x1" in table["v5p"]


def test_available_resources_per_node(ray_cluster):
    free = _compat.available_resources_per_node()
    assert len(free) == len([n for n in ray_cluster.nodes() if n["Alive"]])
    assert all(r.get("CPU", 0) >= 0 for r in free.values())


def test_dataset_meta_count(ray_cluster):
    import ray

    assert _compat.dataset_meta_count(ray.data.from_arrow(pa.table({"a": [1, 2, 3]}))) == 3
    assert _compat.dataset_meta_count(object()) is None


def test_jax_kv_client_is_none_without_distributed(jax_cpu):
    # The attribute path exists; no client before jax.distributed.initialize().
    from jax._src import distributed

    assert hasattr(distributed.global_state, "client")
    assert _compat.jax_kv_client() is None


def test_dataset_preserving_order(ray_cluster):
    import ray

    ds = ray.data.from_arrow(pa.table({"a": [1, 2, 3]}))
    before = ds.context.execution_options.preserve_order
    out = _compat.dataset_preserving_order(ds)
    assert out.context.execution_options.preserve_order
    assert ds.context.execution_options.preserve_order == before  # caller's untouched
    assert out.take_all() == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_dataset_sorting_shuffle(ray_cluster):
    import ray
    from ray.data.context import ShuffleStrategy

    ds = ray.data.from_arrow(pa.table({"a": [3, 1, 2]}))
    before = ds.context.shuffle_strategy
    out = _compat.dataset_sorting_shuffle(ds)
    assert out.context.shuffle_strategy == ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    assert ds.context.shuffle_strategy == before  # caller's untouched
    assert out.sort("a").take_all() == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_blocks_of_rows(ray_cluster):
    import ray

    ds = ray.data.from_arrow([pa.table({"a": list(range(k, k + 5))}) for k in (0, 5, 10)])
    out = _compat.blocks_of_rows(_compat.dataset_preserving_order(ds), 4)
    tables = ray.get(out.to_arrow_refs())
    assert [t.num_rows for t in tables] == [4, 4, 4, 3]
    assert [r for t in tables for r in t.column("a").to_pylist()] == list(range(15))


def test_task_retry_args_silences_only_the_remote_args_deprecation(ray_cluster):
    import warnings

    import ray

    from slicefeed.connectors._compat import task_retry_args, task_retry_options

    assert task_retry_options(1) == {"max_retries": 1}
    ds = ray.data.range(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with task_retry_args():
            out = ds.map_batches(lambda b: b, **task_retry_options(1))
    assert not [w for w in seen if "ray_remote_args" in str(w.message)]
    assert out.count() == 4


def test_kv_try_get_never_blocks():
    class Client:  # the jaxlib client's interface: NOT_FOUND raises
        def key_value_try_get(self, key):
            if key != "k":
                raise RuntimeError("NOT_FOUND")
            return "v"

    assert _compat.kv_try_get(Client(), "k") == "v"
    assert _compat.kv_try_get(Client(), "missing") is None


def test_gcsfs_undecorated_request():
    import gcsfs

    base = _compat.gcsfs_undecorated_request()
    assert base is not None, "gcsfs.GCSFileSystem._request.__wrapped__ is gone"
    assert base is not gcsfs.GCSFileSystem._request and callable(base)


@pytest.mark.parametrize("module", ["ray", "jax", "gcsfs"])
def test_compat_imports_lazily(module):
    import subprocess
    import sys

    code = f"import sys, slicefeed.connectors._compat; print({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_kv_wait_returns_value_or_none():
    class Client:
        def blocking_key_value_get(self, key, timeout_ms):
            assert timeout_ms >= 1
            if key == "k":
                return "v"
            raise RuntimeError("DEADLINE_EXCEEDED")

    assert _compat.kv_wait(Client(), "k", 0) == "v"
    assert _compat.kv_wait(Client(), "missing", 10) is None


def test_ray_extension_types_are_named_and_registered_on_demand():
    """A field Ray Data wrote as its tensor type, read where the type is not
    registered, is its storage type with the name left in its metadata."""
    import numpy as np

    name = {b"ARROW:extension:name": b"ray.data.arrow_tensor_v2",
            b"ARROW:extension:metadata": b"[3, 4]"}
    bare = pa.field("f", pa.large_list(pa.float32()), metadata=name)
    nested = pa.field("g", pa.list_(pa.field("item", pa.large_list(pa.int32()), metadata=name)))
    plain = pa.schema([pa.field("x", pa.int32()), pa.field("y", pa.list_(pa.int32()))])
    assert _compat.unregistered_ray_extension(bare) == "ray.data.arrow_tensor_v2"
    assert _compat.unregistered_ray_extension(nested) == "ray.data.arrow_tensor_v2"
    assert _compat.unregistered_ray_extension(plain.field("y")) is None
    assert not _compat.register_ray_extension_types(plain)
    assert _compat.register_ray_extension_types(pa.schema([bare]))
    # Registered now: the same bytes deserialise as Ray's tensor type.
    back = pa.ipc.read_schema(pa.schema([bare]).serialize()).field("f")
    assert isinstance(back.type, pa.BaseExtensionType) and tuple(back.type.shape) == (3, 4)
    assert _compat.unregistered_ray_extension(back) is None
    assert np.dtype(back.type.storage_type.value_type.to_pandas_dtype()) == np.float32
