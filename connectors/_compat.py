"""The one place that touches private Ray / JAX attributes.

Every function imports its third-party module lazily (importing slicefeed never
imports ray or jax) and falls back to a public, slower or more conservative
path when the private attribute has moved.
"""

from __future__ import annotations

from typing import Any


def dataset_meta_count(ds: Any) -> int | None:
    """Rows of a ``ray.data.Dataset`` when Ray knows them without executing it
    (Parquet footers, in-memory blocks); ``None`` otherwise."""
    meta_count = getattr(ds, "_meta_count", None)
    if meta_count is None:  # pragma: no cover - Ray moved it: count unknown
        return None
    try:
        n = meta_count()
    except Exception:  # pragma: no cover - treat as unknown, never guess
        return None
    return None if n is None else int(n)


def dataset_preserving_order(ds: Any) -> Any:
    """A copy of ``ds`` whose execution keeps block order, without changing the
    caller's Dataset or the global DataContext."""
    import ray.data

    out = ray.data.Dataset.copy(ds)
    if hasattr(out, "_context"):
        # copy() shares the context object; give the copy its own.
        out._context = out.context.copy()
    out.context.execution_options.preserve_order = True
    return out


def jax_kv_client() -> Any:
    """jax.distributed's key-value client, or ``None`` when not initialised."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - JAX moved it
        return None
    return getattr(distributed.global_state, "client", None)


def kv_try_get(client: Any, key: str) -> str | None:
    """The value of ``key`` if set, else ``None``; never blocks."""
    try_get = getattr(client, "key_value_try_get", None)
    if try_get is None:  # pragma: no cover - older jaxlib: a short blocking get
        try:
            return client.blocking_key_value_get(key, 10)
        except Exception:
            return None
    try:
        return try_get(key)
    except Exception:  # not set yet (jaxlib raises NOT_FOUND)
        return None
