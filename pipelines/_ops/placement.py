"""Where Ray Data's preprocessing runs: CPU-only nodes, or TPU hosts too.

On a cluster that has TPU slices and CPU nodes (the usual KubeRay layout on
GKE: a CPU worker group plus TPU worker groups), Ray Data by default spreads
its read/map tasks over every node with a free CPU, TPU hosts included. While
a trainer runs, preprocessing on its hosts competes with the host-side input
pipeline and the training step for CPU and memory. ``cpu_only`` keeps Ray
Data's work on nodes without TPUs; ``any`` allows it everywhere.

The selector uses the ``ray.io/accelerator-type`` label that Ray sets on every
accelerator node by itself (``TPU-V6E`` on a v6e host), so no custom resources
or labels have to be configured on the cluster. Only TPU accelerator types are
excluded: GPU and CPU nodes stay eligible.

Two ways to apply it:

- per operator: ``ds.map_batches(fn, **preprocessing_placement("cpu_only"))``;
- per Dataset execution, for every read, map, shuffle and write task
  (Ray Data's ``ExecutionOptions.label_selector``, which also scopes Ray
  Data's resource budget to the matching nodes):
  ``apply_placement(ds.context, "cpu_only")``.
"""

from __future__ import annotations

import functools
from typing import Any

from slicefeed.connectors import SpecError

__all__ = ["PLACEMENT_MODES", "apply_placement", "placement_label_selector", "preprocessing_placement"]

#: Ray's node label naming the accelerator (``TPU-V6E``, ``A100``, ...).
ACCELERATOR_LABEL = "ray.io/accelerator-type"


@functools.lru_cache(maxsize=1)
def tpu_accelerator_types() -> tuple[str, ...]:
    """Every TPU accelerator type Ray knows: ``TPU-V2`` ... ``TPU-V7X``."""
    from ray.util.tpu import VALID_TPU_TYPES

    return tuple(f"TPU-{v.upper()}" for v in VALID_TPU_TYPES)


def __getattr__(name: str) -> Any:
    # TPU_ACCELERATOR_TYPES is computed from Ray on first use (importing this
    # module does not import Ray).
    if name == "TPU_ACCELERATOR_TYPES":
        return tpu_accelerator_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Spec values -> canonical mode. ``any`` is the pipeline spec spelling
# (``placement: {preprocess_on: cpu_only|any}``).
_MODES = {
    "cpu_only": "cpu_only",
    "any": "any",
    "allow_tpu_hosts": "any",
}
PLACEMENT_MODES = tuple(_MODES)


def _mode(mode: Any) -> str:
    key = mode.strip().lower().replace("-", "_") if isinstance(mode, str) else mode
    if key not in _MODES:
        raise SpecError(
            f"preprocess_on must be one of {', '.join(PLACEMENT_MODES)}, got {mode!r}: "
            "'cpu_only' keeps Ray Data's work off TPU hosts, 'any' allows every node."
        )
    return _MODES[key]


def placement_label_selector(mode: str = "cpu_only") -> dict[str, str] | None:
    """Ray label selector for ``mode``; None when any node may run the work.

    Example:
        >>> placement_label_selector("cpu_only")["ray.io/accelerator-type"][:12]
        '!in(TPU-V2,T'
        >>> placement_label_selector("any") is None
        True
    """
    if _mode(mode) == "any":
        return None
    return {ACCELERATOR_LABEL: f"!in({','.join(tpu_accelerator_types())})"}


def preprocessing_placement(mode: str = "cpu_only") -> dict[str, Any]:
    """Ray remote args that place preprocessing tasks for ``mode``.

    Args:
        mode: ``"cpu_only"``: only nodes without a TPU (nodes whose
            ``ray.io/accelerator-type`` is not a TPU type, including nodes
            without the label); ``"any"`` (alias ``"allow_tpu_hosts"``): no
            constraint.

    Returns:
        Keyword arguments for ``Dataset.map_batches``/``map``/``flat_map``/
        ``filter`` (and ``ray.remote(...).options``): ``{"label_selector":
        {...}}``, or ``{}`` for ``"any"``.

    Raises:
        SpecError: Unknown mode.

    Example:
        >>> sorted(preprocessing_placement("cpu_only"))
        ['label_selector']
        >>> preprocessing_placement("allow_tpu_hosts")
        {}
    """
    selector = placement_label_selector(mode)
    return {} if selector is None else {"label_selector": selector}


def apply_placement(data_context: Any, mode: str = "cpu_only") -> None:
    """Constrains every task and actor of a Dataset's execution to ``mode``.

    Sets ``data_context.execution_options.label_selector`` (Ray Data merges it
    into the remote args of every read, map, shuffle and write; operator-level
    selectors win on key conflicts). Use ``ds.context`` for one Dataset or
    ``ray.data.DataContext.get_current()`` for all Datasets created after it.
    For ``"any"`` an earlier selector on ``ray.io/accelerator-type`` is removed.

    Raises:
        SpecError: Unknown mode.
    """
    selector = placement_label_selector(mode)
    options = data_context.execution_options
    current = dict(options.label_selector or {})
    current.pop(ACCELERATOR_LABEL, None)
    current.update(selector or {})
    options.label_selector = current or None
