"""The one module that touches private Ray, JAX and gcsfs attributes.

Everything slicefeed needs from a third-party library that has no public
API goes through a small function here, so that an upgrade that moves or
removes the attribute breaks one place, with a fallback instead of an
``AttributeError`` deep in a run. Third-party imports are inside the
functions: importing this module imports neither Ray nor JAX.

Checked against the versions in :data:`CHECKED_VERSIONS` (the upper bounds
in ``pyproject.toml`` keep installs within what was checked);
``tests/connectors/test_compat.py`` exercises every entry against the
installed versions.

Entries (private attribute -> fallback when it is gone):

- :func:`valid_tpu_topologies` -- ``ray._private.accelerators.tpu.VALID_TPU_TOPOLOGY``
  -> None (callers accept any well-formed shape).
- :func:`available_resources_per_node` -- ``ray._private.state.available_resources_per_node``
  -> every node's total resources from the public ``ray.nodes()``.
- :func:`dataset_meta_count` -- ``ray.data.Dataset._meta_count`` -> None (unknown).
- :func:`jax_kv_client` -- ``jax._src.distributed.global_state.client`` -> None.
- :func:`dataset_preserving_order` / :func:`dataset_sorting_shuffle` --
  ``Dataset._context`` (its own copy of the DataContext) -> the copy keeps
  sharing the caller's context (and, for the second, a DataContext without
  ``shuffle_strategy`` keeps its own).
- :func:`blocks_of_rows` -- ``strict=`` of ``Dataset.repartition`` (public in
  Ray 2.60, not in every release the version range allows) -> blocks of at
  most the row count.
- :func:`kv_try_get` -- the key-value client's ``key_value_try_get`` (non-blocking)
  -> a 10 ms blocking get.
- :func:`kv_wait` -- the key-value client's ``blocking_key_value_get`` (the
  wait JAX itself uses) -> None after the wait, as for a key not set yet.
- :func:`gcsfs_undecorated_request` -- ``gcsfs.GCSFileSystem._request.__wrapped__``
  -> None (callers keep gcsfs's own retry decorator).
- :func:`quiet_ray_logging` -- the logger name of Ray's token-auth notice
  (``ray._private.authentication...``) -> setting an unused logger's level is harmless.
- :func:`disable_ray_data_progress_bars` -- the ``log_once`` key of Ray Data's
  "progress bars disabled" warning -> the warning shows once.
- :func:`task_retry_options` / :func:`task_retry_args` -- ``max_retries`` passed
  as Ray Data "remote args" (``**ray_remote_args`` of ``map_batches`` /
  ``map_groups``, ``ray_remote_args=`` of ``read_datasource`` /
  ``write_datasink``), deprecated in Ray 2.60 for reads and maps with no named
  replacement -> the deprecation warning is silenced around the calls (Ray
  Data 2.64 drops them: revisit then).
- :func:`register_ray_extension_types` / :func:`unregistered_ray_extension` -- the
  ``ray.data.`` prefix of the Arrow extension names Ray Data gives its tensor and
  pickled-object column types (registered by the public ``import ray.data``)
  -> a renamed type is not recognised: nothing is imported, and a column of it
  reads as its storage type, as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CHECKED_VERSIONS",
    "available_resources_per_node",
    "blocks_of_rows",
    "dataset_meta_count",
    "dataset_preserving_order",
    "dataset_sorting_shuffle",
    "disable_ray_data_progress_bars",
    "gcsfs_undecorated_request",
    "jax_kv_client",
    "kv_try_get",
    "kv_wait",
    "quiet_ray_logging",
    "register_ray_extension_types",
    "task_retry_args",
    "task_retry_options",
    "unregistered_ray_extension",
    "valid_tpu_topologies",
]

#: Library versions the private attributes below were checked on.
CHECKED_VERSIONS = {"ray": "2.60.0", "jax": "0.10.2", "gcsfs": "2026.10.1"}



@functools.lru_cache(maxsize=1)
def valid_tpu_topologies() -> dict[str, frozenset[str]] | None:
    """Ray's table of slice shapes per TPU generation (``{"v6e": {"4x4", ...}}``).

    Ray has no public accessor for the table; None when it has moved, and
    callers then accept any well-formed ``AxB`` / ``AxBxC`` shape.
    """
    try:
        from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY
    except ImportError:
        return None
    if not isinstance(VALID_TPU_TOPOLOGY, dict):
        return None
    return {str(k): frozenset(map(str, v)) for k, v in VALID_TPU_TOPOLOGY.items()}


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Free resources of every alive node, keyed by node id (Ray must be initialised).

    Falls back to each node's *total* resources (``ray.nodes()``, public)
    when Ray's private per-node state API is gone: busy TPUs then look free.
    """
    try:
        from ray._private.state import available_resources_per_node as free
    except ImportError:
        free = None
    if free is not None:
        return free()
    import ray

    return {n["NodeID"]: dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")}


def dataset_meta_count(ds: Any) -> int | None:
    """Rows of a ``ray.data.Dataset`` when known from metadata alone, else None.

    Uses ``Dataset._meta_count()`` (no execution); never runs the dataset.
    """
    fn = getattr(ds, "_meta_count", None)
    if fn is None:
        return None
    try:
        n = fn()
    except Exception:  # noqa: BLE001 - informative only; unknown is a valid answer
        return None
    return int(n) if n is not None else None


def jax_kv_client() -> Any | None:
    """JAX's distributed key-value store client; None before ``jax.distributed.initialize()``.

    The client (``key_value_set``, ``blocking_key_value_get``,
    ``key_value_delete``...) is what multi-host JAX itself uses to agree on
    values; there is no public handle to it.
    """
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = getattr(distributed, "global_state", None)
    return getattr(state, "client", None)


def gcsfs_undecorated_request() -> Callable[..., Any] | None:
    """``GCSFileSystem._request`` without gcsfs's retry decorator, or None.

    slicefeed re-applies gcsfs's own ``retry_request`` with its retry count;
    None means the hook is gone and callers keep gcsfs's default retries.
    """
    import gcsfs

    return getattr(getattr(gcsfs.GCSFileSystem, "_request", None), "__wrapped__", None)


# Ray's logger that warns, on every local ``ray.init``, that token
# authentication was switched on (or is off).
_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_ray_logging(verbose: bool) -> None:
    """Hides Ray's INFO lines, token-auth notice and deprecation warnings unless ``verbose``.

    Ray Data's console handler (named ``console`` by its logging config) is
    raised to WARNING; its session log files under ``/tmp/ray/session_*/logs``
    keep everything. Call after ``import ray`` and before ``ray.init``.
    """
    import warnings

    import ray.data  # noqa: F401 - configures the "ray.data" logger
    from ray.util.annotations import RayDeprecationWarning

    if not verbose:
        # Ray's notices about its own API's future are for developers (-v).
        warnings.filterwarnings("ignore", category=RayDeprecationWarning)
    level = logging.INFO if verbose else logging.WARNING
    for handler in logging.getLogger("ray.data").handlers:
        if handler.get_name() == "console":
            handler.setLevel(level)
    logging.getLogger(_RAY_AUTH_LOGGER).setLevel(logging.INFO if verbose else logging.ERROR)


def disable_ray_data_progress_bars() -> None:
    """Turns Ray Data's progress bars off without its "Progress bars disabled" warning.

    The warning is issued once per process under a ``log_once`` key;
    claiming that key first keeps it off the console.
    """
    from ray.data import DataContext
    from ray.util.debug import log_once

    DataContext.get_current().enable_progress_bars = False
    log_once("ray_data_progress_manager_disabled")


def _own_context(ds: Any) -> Any:
    """A copy of ``ds`` with its own DataContext (``Dataset.copy`` shares the
    caller's), so settings made on it change neither the caller's Dataset nor
    the global DataContext."""
    import ray.data

    out = ray.data.Dataset.copy(ds)
    if hasattr(out, "_context"):
        out._context = out.context.copy()
    return out


def dataset_preserving_order(ds: Any) -> Any:
    """A copy of ``ds`` whose execution keeps block order, without changing the
    caller's Dataset or the global DataContext."""
    out = _own_context(ds)
    out.context.execution_options.preserve_order = True
    return out


def dataset_sorting_shuffle(ds: Any) -> Any:
    """A copy of ``ds`` whose shuffles (``sort``, ``groupby``) run as Ray's
    sort-based pull shuffle (``ShuffleStrategy.SORT_SHUFFLE_PULL_BASED``: tasks
    whose output is in key order), not the hash shuffle Ray 2.60 defaults to,
    whose aggregator actors start for each shuffle (5-8 s fixed on a small
    cluster) and whose output blocks come in another order on each run. The
    caller's Dataset and the global DataContext are unchanged."""
    from ray.data import context as ray_context

    out = _own_context(ds)
    strategy = getattr(ray_context, "ShuffleStrategy", None)
    if strategy is not None and hasattr(out.context, "shuffle_strategy"):
        out.context.shuffle_strategy = strategy.SORT_SHUFFLE_PULL_BASED
    return out


def blocks_of_rows(ds: Any, rows: int) -> Any:
    """``ds`` cut into blocks of exactly ``rows`` rows in its order (the last
    one shorter): Ray's streaming ``repartition(target_num_rows_per_block=rows,
    strict=True)``. A Ray without ``strict`` makes them at most ``rows``
    (best effort, so then the cut depends on the blocks that came in)."""
    import inspect

    if "strict" in inspect.signature(ds.repartition).parameters:
        return ds.repartition(target_num_rows_per_block=rows, strict=True)
    return ds.repartition(target_num_rows_per_block=rows)


def kv_try_get(client: Any, key: str) -> str | None:
    """The value of ``key`` in JAX's key-value store if set, else None; never blocks
    for long (a waiting loop can then notice a stop request)."""
    try_get = getattr(client, "key_value_try_get", None)
    if try_get is None:
        try:
            return client.blocking_key_value_get(key, 10)
        except Exception:  # noqa: BLE001 - not set yet
            return None
    try:
        return try_get(key)
    except Exception:  # noqa: BLE001 - not set yet (jaxlib raises NOT_FOUND)
        return None


def kv_wait(client: Any, key: str, timeout_ms: int) -> str | None:
    """The value of ``key`` in JAX's key-value store, waiting up to ``timeout_ms``
    for it to be set (the server answers as soon as it is; the GIL is released
    while waiting); None if it is not set by then."""
    try:
        return client.blocking_key_value_get(key, max(int(timeout_ms), 1))
    except Exception:  # noqa: BLE001 - not set in time (jaxlib raises DEADLINE_EXCEEDED)
        return None


def kv_create(client: Any, key: str, value: str) -> bool:
    """Sets ``key`` in JAX's key-value store only if it is not set: True if this
    call set it, False if it was already set (the store refuses an overwrite
    atomically, so of several hosts creating one key exactly one wins).

    Raises:
        Exception: jaxlib's error for anything else (the store unreachable).
    """
    try:
        client.key_value_set(key, value, allow_overwrite=False)
    except Exception as e:
        if "ALREADY_EXISTS" in str(e):
            return False
        raise
    return True


def task_retry_options(retries: int) -> dict[str, Any]:
    """Ray Data task options that rerun a task whose worker died at most ``retries`` times.

    Ray Data submits its tasks with ``max_retries=-1`` (rerun forever). Ray
    2.60 has no public setting for it: the named remote parameters of reads,
    maps and writes are ``num_cpus``, ``memory``, ``label_selector``,
    ``fallback_strategy``, ``max_calls``, ``resources``, ``accelerator_type``,
    ``runtime_env`` (and ``max_concurrency``); ``DataContext.max_map_retries``
    / ``retried_map_errors`` rerun a map on a Python exception inside the
    worker, not on its death; ``max_consecutive_actor_init_deaths`` is for
    actor pools. So the option travels as a remote arg: pass the result as
    ``**options`` to ``map_batches`` / ``map_groups`` or as
    ``ray_remote_args=`` to ``read_datasource`` / ``write_datasink``, inside
    :func:`task_retry_args`.
    """
    return {"max_retries": int(retries)}


@contextlib.contextmanager
def task_retry_args() -> Iterator[None]:
    """Context in which Ray Data calls may pass ``max_retries`` as remote args.

    Ray Data submits its tasks with ``max_retries=-1`` (a task whose worker
    dies is rerun forever). Bounding it is only possible through the remote
    args of ``read_datasource`` / ``map_batches``, which Ray 2.60 deprecates
    without a named parameter for ``max_retries``; this silences that one
    warning around the calls.
    """
    try:
        from ray.util.annotations import RayDeprecationWarning
    except ImportError:  # pragma: no cover - moved: nothing to silence
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*",
                                category=RayDeprecationWarning)
        yield


# Arrow keeps an extension type that no one in the process registered as its
# storage type, with the type's name left in this field metadata key.
_EXTENSION_NAME_KEY = b"ARROW:extension:name"
# Ray Data names its extension types ``ray.data.arrow_tensor``,
# ``ray.data.arrow_tensor_v2``, ``ray.data.arrow_variable_shaped_tensor``,
# ``ray.data.arrow_pickled_object``.
_RAY_EXTENSION_PREFIX = b"ray.data."


def _fields_within(field: Any) -> Iterator[Any]:
    """``field`` and the fields nested in its struct / list types."""
    yield field
    t = field.type
    children = [t.field(i) for i in range(t.num_fields)] if hasattr(t, "names") else []
    if hasattr(t, "value_field"):
        children = [t.value_field]
    for child in children:
        yield from _fields_within(child)


def unregistered_ray_extension(field: Any) -> str | None:
    """The name of a Ray Data extension type that ``field`` (or a field nested
    in it) was written with but reads without, because this process has not
    registered it; None when there is none.

    Such a field's type is the extension's storage (a tensor's storage is a
    variable-length list of all its values: its per-row shape is lost).
    """
    for f in _fields_within(field):
        name = (f.metadata or {}).get(_EXTENSION_NAME_KEY, b"")
        if name.startswith(_RAY_EXTENSION_PREFIX):
            return name.decode("utf-8", "replace")
    return None


def register_ray_extension_types(schema: Any) -> bool:
    """Registers Ray Data's Arrow extension types when ``schema`` has a field
    written with one that this process has not registered.

    True when it registered them: deserialise the schema (or read the file)
    again to get the extension types. False when no field needs them or
    ``ray.data`` cannot be imported (such fields keep their storage types;
    :func:`unregistered_ray_extension` still names them).
    Ray Data registers its types when ``ray.data`` is imported, which a
    process that only reads a committed dataset may never have done.
    """
    if not any(unregistered_ray_extension(f) for f in schema):
        return False
    try:
        import ray.data  # noqa: F401 - registers the extension types
    except ImportError:
        return False
    return True
