"""Device placement: the default mesh, batch-size arithmetic, host batch -> global jax.Array."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slicefeed.connectors import SpecError
from slicefeed.connectors._errors import short_repr

# The axis name Ray Data's iter_jax_batches shards the batch over.
DATA_AXIS = "data"


def default_sharding():
    """A 1-D ``"data"`` mesh over every device, batch axis sharded over it.

    Built with public JAX APIs the way Ray Data's ``iter_jax_batches`` builds its
    own (``mesh_utils.create_device_mesh`` for a topology-aware device order,
    plain ``jax.devices()`` order if that fails), so batches from either compare
    equal in sharding and never recompile a jitted step.
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    try:
        from jax.experimental import mesh_utils

        devices = mesh_utils.create_device_mesh((jax.device_count(),))
    except Exception:  # noqa: BLE001 - topology-aware order is an optimisation; same fallback as Ray's
        devices = np.array(jax.devices())
    return NamedSharding(Mesh(devices, (DATA_AXIS,)), PartitionSpec(DATA_AXIS))


class Placement:
    """Where a batch goes: a mesh, a partition spec for the batch axis, and the
    global / local batch sizes that split evenly over it.

    Raises:
        SpecError: a global batch the batch shards and hosts cannot split evenly
            (the message suggests a size).
    """

    def __init__(self, global_batch_size: Any, *, mesh: Any = None, partition_spec: Any = None):
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        self.process_count = jax.process_count()
        self.process_index = jax.process_index()
        if mesh is None:
            if partition_spec is not None:
                raise SpecError("JaxLoader: partition_spec= needs mesh= as well.")
            sharding = default_sharding()
            self.mesh, self.spec = sharding.mesh, sharding.spec
            batch_shards = jax.device_count()
            what = f"the number of devices ({batch_shards})"
            per_host_unit = jax.local_device_count()
        else:
            spec = partition_spec if partition_spec is not None else PartitionSpec(
                tuple(mesh.axis_names)
            )
            self.mesh, self.spec = mesh, PartitionSpec(*spec)
            lead = self.spec[0] if len(self.spec) else None
            axes = () if lead is None else (lead,) if isinstance(lead, str) else tuple(lead)
            batch_shards = math.prod(mesh.shape[a] for a in axes)
            what = f"the batch axes {axes} of the mesh ({batch_shards} shards)"
            per_host_unit = 1
        self.sharding = NamedSharding(self.mesh, self.spec)
        unit = math.lcm(batch_shards, self.process_count)
        if (
            not isinstance(global_batch_size, int)
            or isinstance(global_batch_size, bool)
            or not 0 < global_batch_size < 2**63  # row counts are int64
            or global_batch_size % unit
        ):
            suggest = (
                unit * max(1, -(-global_batch_size // unit))
                if isinstance(global_batch_size, int) and global_batch_size < 2**63
                else unit
            )
            raise SpecError(
                f"JaxLoader: global_batch_size ({short_repr(global_batch_size)}) must be a positive "
                f"multiple of {what} and of the number of hosts ({self.process_count}); "
                f"try global_batch_size={suggest}."
            )
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // self.process_count
        if self.local_batch_size % per_host_unit:
            raise SpecError(
                f"JaxLoader: this host's batch ({self.local_batch_size} rows) must be a "
                f"multiple of its local devices ({per_host_unit}); try "
                f"global_batch_size={math.lcm(unit, per_host_unit * self.process_count)}."
            )
        held = _rows_held(self.mesh, self.spec, global_batch_size)
        if held != self.local_batch_size:
            # Each host delivers its own local_batch_size rows of every batch; JAX
            # refuses, at the first batch, a layout that puts another count here.
            raise SpecError(
                f"JaxLoader: the batch axes of partition_spec {tuple(self.spec)} put {held} of "
                f"the {global_batch_size} rows of each batch on this host's devices, but each "
                f"of the {self.process_count} hosts delivers its own {self.local_batch_size}; "
                f"shard the batch axis over mesh axes that span the hosts (the first entry of "
                f"partition_spec), as the default mesh does.")
        self._by_ndim: dict[int, Any] = {}
        self._plans: dict[tuple, tuple[dict, dict]] = {}

    def to_global(self, host: dict[str, np.ndarray]) -> dict:
        """This host's rows of every column -> global ``jax.Array`` s (one call)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        # One call for the whole batch: on one process it is a single batched
        # device_put instead of one per column (benchmarks/README.md).
        key = tuple((k, v.shape) for k, v in host.items())
        plan = self._plans.get(key)  # the same columns and shapes every step
        if plan is None:
            shardings, shapes = {}, {}
            for k, v in host.items():
                sh = self._by_ndim.get(v.ndim)
                if sh is None:
                    spec = PartitionSpec(*tuple(self.spec)[: v.ndim])
                    sh = self._by_ndim[v.ndim] = NamedSharding(self.mesh, spec)
                shardings[k] = sh
                shapes[k] = (self.global_batch_size,) + v.shape[1:]
            plan = self._plans[key] = (shardings, shapes)
        return jax.make_array_from_process_local_data(plan[0], host, plan[1])


def _rows_held(mesh: Any, spec: Any, global_batch_size: int) -> int:
    """How many rows of a ``global_batch_size`` batch the batch axes of ``spec``
    put on this process's devices (rows on several of them counted once)."""
    from jax.sharding import NamedSharding, PartitionSpec

    lead = NamedSharding(mesh, PartitionSpec(*tuple(spec)[:1]))
    spans = sorted({idx[0].indices(global_batch_size)[:2] for idx in
                    lead.addressable_devices_indices_map((global_batch_size,)).values()})
    held, end = 0, 0
    for lo, hi in spans:  # contiguous shards: overlapping ones are counted once
        held += max(0, hi - max(lo, end))
        end = max(end, hi)
    return held
