"""TPU slice topology: chips, hosts, Ray Train arguments and GKE node selectors.

A :class:`SliceSpec` names one TPU slice shape the way a user declares it
(``topology="4x4"``, ``accelerator="v6e"``) and answers the questions the rest
of slicefeed asks about it: how many chips and hosts, how many chips per host,
which ``ray.train.ScalingConfig`` arguments start one worker per host, which
GKE node selectors a KubeRay worker group needs, and whether a global batch
size splits evenly over the slice's devices.

Chip and host counts come from Ray's own TPU helpers (``ray.util.tpu``) and
the valid shapes from Ray's topology table (through
:mod:`slicefeed.connectors._compat`), so a spec agrees with what
``JaxTrainer`` and ``slice_placement_group`` will reserve. Ray is imported on
first use, never jax, and no running Ray cluster is needed.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Any

from slicefeed.connectors import SpecError
from slicefeed.connectors._compat import valid_tpu_topologies

__all__ = ["GKE_ACCELERATOR_LABEL", "GKE_TOPOLOGY_LABEL", "SliceSpec"]

#: GKE node label holding the TPU accelerator (``tpu-v6e-slice``, ...).
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
#: GKE node label holding the slice topology (``4x4``, ``2x2x2``, ...).
GKE_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"

# Ray's generation name -> GKE's accelerator label value
# (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
_GKE_ACCELERATORS = {
    "v4": "tpu-v4-podslice",
    "v5litepod": "tpu-v5-lite-podslice",
    "v5p": "tpu-v5p-slice",
    "v6e": "tpu-v6e-slice",
}

# Every spelling users write -> Ray's generation name. Ray calls v5e
# "v5litepod" (its accelerator type is TPU-V5LITEPOD); GKE calls it
# "tpu-v5-lite-podslice". All of them are accepted.
_ALIASES = {
    "v4": "v4",
    "v5p": "v5p",
    "v5e": "v5litepod",
    "v5litepod": "v5litepod",
    "v5lite": "v5litepod",
    "v6e": "v6e",
}
_ALIASES.update({gke: gen for gen, gke in _GKE_ACCELERATORS.items()})


def _normalise_accelerator(accelerator: Any) -> str:
    """Maps any accepted spelling to Ray's generation name (``v6e``, ``v5litepod``)."""
    if not isinstance(accelerator, str) or not accelerator.strip():
        raise SpecError(
            f"accelerator must be a non-empty string such as 'v6e' or 'TPU-V6E', "
            f"got {accelerator!r}."
        )
    key = accelerator.strip().lower()
    if key.startswith("tpu-") and key not in _ALIASES:
        key = key[len("tpu-"):]
    elif key.startswith("tpu") and key[3:4] == "v":
        key = key[3:]
    if key in _ALIASES:
        return _ALIASES[key]
    # A pod type such as "v6e-16" names the generation plus a size; the size
    # must come from `topology`, so say so instead of guessing.
    gen, _, size = key.partition("-")
    if gen in _ALIASES and size.isdigit():
        raise SpecError(
            f"accelerator {accelerator!r} looks like a pod type (generation-cores); "
            f"pass the generation ({gen!r}) as accelerator and the shape as "
            f"topology (e.g. SliceSpec('4x4', '{gen}'))."
        )
    raise SpecError(
        f"unknown TPU accelerator {accelerator!r}; expected one of "
        f"v4, v5e (or v5litepod), v5p, v6e, optionally written as Ray's "
        f"accelerator type (TPU-V6E) or GKE's (tpu-v6e-slice)."
    )


def _as_int(value: Any) -> int | None:
    """``int(value)`` for ints and NumPy integers; None for bools, floats, strings."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _num_chips(topology: str) -> int:
    from ray.util.tpu import get_num_chips_from_topology

    return get_num_chips_from_topology(topology)


def _sorted_topologies(generation: str) -> list[str]:
    table = valid_tpu_topologies() or {}
    return sorted(table.get(generation, ()), key=lambda t: (_num_chips(t), t))


# Shapes by dimensionality, for when Ray's table is unavailable.
_SHAPE_2D = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*$")
_SHAPE_3D = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*$")


def _is_valid_topology(generation: str, topology: str) -> bool:
    table = valid_tpu_topologies()
    if table is not None and generation in table:
        return topology in table[generation]
    shape = _SHAPE_3D if generation in ("v4", "v5p", "v7x") else _SHAPE_2D
    return bool(shape.match(topology))


@dataclasses.dataclass(frozen=True)
class SliceSpec:
    """One TPU slice shape: ``topology`` (``"4x4"``) on ``accelerator`` (``"v6e"``).

    Args:
        topology: Chip grid as GKE and Ray spell it: ``"AxB"`` for v5e/v6e,
            ``"AxBxC"`` for v4/v5p. Case and surrounding spaces are ignored.
        accelerator: TPU generation: ``"v4"``, ``"v5e"`` (alias ``"v5litepod"``),
            ``"v5p"`` or ``"v6e"``; Ray's ``"TPU-V6E"`` and GKE's
            ``"tpu-v6e-slice"`` spellings are accepted too. Stored as Ray's
            generation name (``"v5e"`` becomes ``"v5litepod"``).

    Raises:
        SpecError: Unknown accelerator, or a topology that generation does not
            offer (the message lists the valid ones).

    Example:
        >>> spec = SliceSpec("4x4", "TPU-V6E")
        >>> spec.num_chips, spec.num_hosts, spec.chips_per_host, spec.pod_type
        (16, 4, 4, 'v6e-16')
        >>> spec.node_selectors()["cloud.google.com/gke-tpu-accelerator"]
        'tpu-v6e-slice'
    """

    topology: str
    accelerator: str

    def __post_init__(self) -> None:
        generation = _normalise_accelerator(self.accelerator)
        if not isinstance(self.topology, str):
            raise SpecError(
                f"topology must be a string such as '4x4' or '2x2x2', got {self.topology!r}."
            )
        topology = self.topology.strip().lower().replace(" ", "")
        if not _is_valid_topology(generation, topology):
            raise SpecError(
                f"topology {self.topology!r} is not a {generation} slice shape; valid "
                f"{generation} topologies: {', '.join(_sorted_topologies(generation))}."
            )
        object.__setattr__(self, "accelerator", generation)
        object.__setattr__(self, "topology", topology)

    # -- shape ---------------------------------------------------------------

    @property
    def num_chips(self) -> int:
        """Chips in the slice (``4x4`` -> 16, ``2x2x2`` -> 8)."""
        return _num_chips(self.topology)

    @property
    def chips_per_host(self) -> int:
        """Chips on each host (VM): 4 for multi-host slices; up to 8 for
        single-host v5e/v6e shapes (``2x4`` -> 8, ``1x1`` -> 1), as Ray decides."""
        from ray.util.tpu import get_chips_per_host

        return min(get_chips_per_host(self.topology, self.accelerator), self.num_chips)

    @property
    def num_hosts(self) -> int:
        """Hosts (VMs, one JAX process and one Ray Train worker each)."""
        return max(1, self.num_chips // self.chips_per_host)

    @property
    def num_devices(self) -> int:
        """JAX devices on the slice: one per chip (v4/v5p run in megacore mode)."""
        return self.num_chips

    @property
    def is_multi_host(self) -> bool:
        """True when the slice spans more than one host."""
        return self.num_hosts > 1

    # -- names ---------------------------------------------------------------

    @property
    def pod_type(self) -> str:
        """Ray/GCE pod type, counted in TensorCores: ``v6e-16``, ``v4-16`` for 2x2x2."""
        from ray.util.tpu import infer_tpu_pod_type_from_topology

        return infer_tpu_pod_type_from_topology(self.topology, self.accelerator)

    @property
    def ray_accelerator_type(self) -> str:
        """Ray's accelerator type resource/label value: ``TPU-V6E``, ``TPU-V5LITEPOD``."""
        return f"TPU-{self.accelerator.upper()}"

    @property
    def gke_accelerator(self) -> str:
        """GKE's ``cloud.google.com/gke-tpu-accelerator`` value: ``tpu-v6e-slice``."""
        return _GKE_ACCELERATORS[self.accelerator]

    @property
    def head_resource(self) -> str:
        """Custom resource Ray puts on worker 0 of each slice: ``TPU-v6e-16-head``."""
        return f"TPU-{self.pod_type}-head"

    # -- consumers -----------------------------------------------------------

    def node_selectors(self) -> dict[str, str]:
        """GKE node selectors that land a pod on a host of this slice shape."""
        return {
            GKE_ACCELERATOR_LABEL: self.gke_accelerator,
            GKE_TOPOLOGY_LABEL: self.topology,
        }

    def scaling_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ray.train.ScalingConfig``: one worker per host.

        Example:
            >>> SliceSpec("4x4", "v6e").scaling_config_kwargs()["resources_per_worker"]
            {'TPU': 4}
        """
        return {
            "num_workers": self.num_hosts,
            "use_tpu": True,
            "topology": self.topology,
            "accelerator_type": self.ray_accelerator_type,
            "resources_per_worker": {"TPU": self.chips_per_host},
        }

    def validate_global_batch_size(
        self, global_batch_size: int, devices: int | None = None
    ) -> int:
        """Checks that ``global_batch_size`` splits evenly over the slice's devices.

        Args:
            global_batch_size: Rows per step over the whole slice.
            devices: Devices the batch is sharded over; defaults to
                :attr:`num_devices` (pass ``jax.device_count()`` when it differs,
                e.g. on a simulated slice).

        Returns:
            ``global_batch_size`` unchanged.

        Raises:
            SpecError: Not a positive multiple of the device count; the message
                proposes the nearest valid sizes.
        """
        d = self.num_devices if devices is None else _as_int(devices)
        if d is None or d <= 0:
            raise SpecError(f"devices must be a positive integer, got {devices!r}.")
        n = _as_int(global_batch_size)
        if n is None:
            raise SpecError(
                f"global_batch_size must be an integer, got {global_batch_size!r} "
                f"({type(global_batch_size).__name__}); use a multiple of {d}, e.g. {d * 8}."
            )
        if devices is None:
            where = f"the {d} devices of a {self.accelerator} {self.topology} slice"
        else:
            where = f"the {d} devices"
        if n <= 0:
            raise SpecError(
                f"global_batch_size ({n}) must be positive and divisible by {where}; try {d}."
            )
        if n % d:
            lower, upper = (n // d) * d, (n // d + 1) * d
            options = f"{lower} or {upper}" if lower else f"{upper}"
            raise SpecError(
                f"global_batch_size ({n}) must be divisible by {where} "
                f"({n} = {n // d} x {d} + {n % d}); try {options}."
            )
        return n

    @classmethod
    def from_pod_type(cls, pod_type: str, topology: str) -> SliceSpec:
        """Builds a spec from a Ray node's ``ray.io/tpu-pod-type`` and topology labels.

        Raises:
            SpecError: The pod type does not match the topology.
        """
        generation = str(pod_type).strip().lower().partition("-")[0]
        spec = cls(topology, generation)
        if spec.pod_type != str(pod_type).strip().lower():
            raise SpecError(
                f"pod type {pod_type!r} does not match topology {topology!r}: a "
                f"{spec.accelerator} {spec.topology} slice is {spec.pod_type}."
            )
        return spec
