"""The JAX loader, one job per module:

- ``_options``: the keyword options as a frozen, validated dataclass;
- ``_plan``: pure planning (host shares, equal steps, read windows; no I/O);
- ``_sources``: where rows come from (committed dataset, Ray Dataset / iterator)
  behind a small protocol;
- ``_convert``: Arrow -> NumPy with the dtype rules (no JAX);
- ``_placement``: default mesh, batch-size arithmetic, host -> global jax.Array;
- ``_agree``: multi-host agreement through jax.distributed's key-value store;
- ``_produce``: one host's steps (equal steps, remainder, conversion, transfer);
- ``_prefetch``: the background producer thread;
- ``_jaxloader``: :class:`JaxLoader`, which composes them.

Importing this package imports neither jax nor ray.
"""

from slicefeed.pipelines._loader._jaxloader import JaxLoader
from slicefeed.pipelines._loader._options import LoaderOptions

__all__ = ["JaxLoader", "LoaderOptions"]
