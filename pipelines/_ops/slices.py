"""``slicefeed slices``: the TPU slices of a Ray cluster, and which are usable.

A multi-host trainer (``JaxTrainer`` with ``ScalingConfig(use_tpu=True,
topology=...)``) first reserves a slice's worker 0, then gang-schedules one
worker per host of that slice. If a host of the slice is missing (preempted,
not yet provisioned, crashed), the reservation never completes: the trainer
waits and retries without an error. This command shows every slice with the
hosts it has versus the hosts its topology needs, and flags incomplete ones.

Example::

    $ slicefeed slices --address 10.0.0.2:6379
    SLICE    ACCELERATOR  TOPOLOGY  POD TYPE  HOSTS  STATE
    slice-a  TPU-V6E      4x4       v6e-16    4/4    free
    slice-b  TPU-V6E      4x4       v6e-16    3/4    INCOMPLETE (missing worker 3)

The data comes from the node labels Ray sets on TPU hosts
(``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-topology``,
``ray.io/tpu-pod-type``, ``ray.io/accelerator-type``) and the nodes' free
``TPU`` resources.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from slicefeed.connectors import SpecError
from slicefeed.pipelines._ops.topology import SliceSpec

__all__ = ["SliceInfo", "add_parser", "list_slices", "run_slices"]

_SLICE_NAME = "ray.io/tpu-slice-name"
_WORKER_ID = "ray.io/tpu-worker-id"
_TOPOLOGY = "ray.io/tpu-topology"
_POD_TYPE = "ray.io/tpu-pod-type"
_ACCEL_TYPE = "ray.io/accelerator-type"


@dataclasses.dataclass(frozen=True)
class SliceInfo:
    """One TPU slice as the cluster sees it.

    Attributes:
        name: Slice name (``TPU_NAME`` on GKE; Ray's ``ray.io/tpu-slice-name``).
        accelerator: Ray accelerator type, e.g. ``TPU-V6E``.
        topology: e.g. ``4x4``.
        pod_type: e.g. ``v6e-16``.
        hosts_present: Alive hosts of the slice.
        hosts_expected: Hosts the topology needs; None if the shape is unknown.
        worker_ids: ``TPU_WORKER_ID`` of the alive hosts, sorted.
        missing_worker_ids: Worker ids the topology needs that are not alive.
        chips: ``TPU`` resources over the alive hosts.
        busy_hosts: Hosts whose TPUs are (partly) taken, counting worker 0 as
            taken once its slice-head resource is reserved.
    """

    name: str
    accelerator: str
    topology: str
    pod_type: str
    hosts_present: int
    hosts_expected: int | None
    worker_ids: tuple[int, ...]
    missing_worker_ids: tuple[int, ...]
    chips: int
    busy_hosts: int

    @property
    def complete(self) -> bool:
        """All hosts of the topology are alive."""
        return self.hosts_expected is not None and not self.missing_worker_ids and (
            self.hosts_present >= self.hosts_expected
        )

    @property
    def busy(self) -> bool:
        """Some host's TPUs, or the slice's head reservation, are taken."""
        return self.busy_hosts > 0

    @property
    def state(self) -> str:
        """``free``, ``busy``, or ``INCOMPLETE (...)`` plus ``, busy``."""
        if not self.complete:
            if self.missing_worker_ids:
                missing = ", ".join(str(w) for w in self.missing_worker_ids)
                plural = "s" if len(self.missing_worker_ids) > 1 else ""
                detail = f"missing worker{plural} {missing}"
            else:
                detail = "hosts expected unknown"
            return f"INCOMPLETE ({detail})" + (", busy" if self.busy else "")
        return "busy" if self.busy else "free"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["worker_ids"] = list(self.worker_ids)
        d["missing_worker_ids"] = list(self.missing_worker_ids)
        d.update(complete=self.complete, busy=self.busy, state=self.state)
        return d


def _expected_hosts(pod_type: str, topology: str, accelerator: str) -> int | None:
    try:
        return SliceSpec.from_pod_type(pod_type, topology).num_hosts
    except SpecError:
        pass
    # A generation SliceSpec does not model (v2, v3, v7x): Ray's own rule.
    try:
        from ray.util.tpu import get_tpu_version_from_type, get_tpu_worker_resources

        version = get_tpu_version_from_type(accelerator)
        workers, _ = get_tpu_worker_resources(topology, f"TPU-{version.upper()}")
        return workers
    except Exception:  # noqa: BLE001 - unknown shape: report it rather than fail the listing
        return None


def list_slices(nodes: list[dict], available: dict[str, dict[str, float]]) -> list[SliceInfo]:
    """Groups alive TPU nodes into slices.

    Args:
        nodes: ``ray.nodes()``.
        available: Free resources per node id
            (:func:`slicefeed.connectors._compat.available_resources_per_node`).

    Returns:
        One :class:`SliceInfo` per slice, sorted by name.
    """
    groups: dict[str, list[dict]] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        labels = node.get("Labels") or {}
        resources = node.get("Resources") or {}
        if not resources.get("TPU") and _SLICE_NAME not in labels:
            continue
        # A TPU host without a slice name (hand-started node) is its own slice.
        name = labels.get(_SLICE_NAME) or f"node-{node['NodeID'][:12]}"
        groups.setdefault(name, []).append(node)

    out = []
    for name, members in sorted(groups.items()):
        labels = [m.get("Labels") or {} for m in members]
        first = labels[0]
        topology = first.get(_TOPOLOGY, "")
        pod_type = first.get(_POD_TYPE, "")
        accelerator = first.get(_ACCEL_TYPE, "") or (
            f"TPU-{pod_type.split('-')[0].upper()}" if pod_type else ""
        )
        expected = _expected_hosts(pod_type, topology, accelerator) if topology and pod_type else None
        worker_ids = sorted(int(lb[_WORKER_ID]) for lb in labels if lb.get(_WORKER_ID, "").isdigit())
        missing: tuple[int, ...] = ()
        if expected is not None:
            missing = tuple(sorted(set(range(expected)) - set(worker_ids)))
        head_resource = f"TPU-{pod_type}-head"
        busy_hosts = 0
        chips = 0
        for m in members:
            total = m.get("Resources") or {}
            chips += int(total.get("TPU", 0))
            if m["NodeID"] not in available:
                continue  # not reported yet (just joined): count it as free
            # Ray leaves fully used resources out of the free list: absent means 0.
            free = available[m["NodeID"]]
            taken = free.get("TPU", 0) < total.get("TPU", 0)
            if head_resource in total and free.get(head_resource, 0) < total[head_resource]:
                taken = True
            busy_hosts += bool(taken)
        out.append(
            SliceInfo(
                name=name,
                accelerator=accelerator,
                topology=topology,
                pod_type=pod_type,
                hosts_present=len(members),
                hosts_expected=expected,
                worker_ids=tuple(worker_ids),
                missing_worker_ids=missing,
                chips=chips,
                busy_hosts=busy_hosts,
            )
        )
    return out


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fails fast on a GCS address nobody listens on.

    ``ray.init`` retries an unreachable GCS for minutes before giving up; a TCP
    connect answers in milliseconds.
    """
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", ray:// client addresses: leave them to ray.init
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ConnectionError(f"nothing answers at {address} ({e.strerror or e})") from e


def _query_cluster(address: str | None) -> tuple[list[dict], dict[str, dict[str, float]], str]:
    import ray

    from slicefeed.connectors._compat import available_resources_per_node

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    _check_reachable(target)
    ray.init(
        address=target,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=False,
    )
    try:
        nodes = ray.nodes()
        available = available_resources_per_node()
        gcs = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    return nodes, available, gcs


def format_table(slices: list[SliceInfo]) -> str:
    """Human-readable table plus a warning per incomplete slice."""
    if not slices:
        return "No TPU slices in this cluster (no node has TPU resources or ray.io/tpu-* labels)."
    header = ("SLICE", "ACCELERATOR", "TOPOLOGY", "POD TYPE", "HOSTS", "STATE")
    rows = [
        (
            s.name,
            s.accelerator or "?",
            s.topology or "?",
            s.pod_type or "?",
            f"{s.hosts_present}/{s.hosts_expected if s.hosts_expected is not None else '?'}",
            s.state,
        )
        for s in slices
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    incomplete = [s for s in slices if not s.complete]
    if incomplete:
        lines.append("")
        for s in incomplete:
            lines.append(
                f"warning: slice {s.name!r} is incomplete ({s.hosts_present} of "
                f"{s.hosts_expected if s.hosts_expected is not None else '?'} hosts): a trainer "
                f"that reserves it (ScalingConfig(topology={s.topology!r}, "
                f"accelerator_type={s.accelerator!r})) waits and retries without an error. "
                "Bring the missing hosts back or remove the slice."
            )
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``slices`` to a ``slicefeed`` argparse subparsers object."""
    parser = subparsers.add_parser(
        "slices",
        help="list the TPU slices of a Ray cluster and flag incomplete ones",
        description=(
            "List the TPU slices of a Ray cluster: slice name, accelerator, topology, "
            "hosts present versus expected, free or busy. Incomplete slices are flagged: "
            "a trainer that lands on one waits and retries without an error."
        ),
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (host:port of the GCS); default: $RAY_ADDRESS, then 'auto'",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks")
    parser.add_argument(
        "--fail-on-incomplete",
        action="store_true",
        help="exit with status 1 when any slice is incomplete (for pre-flight checks)",
    )
    parser.set_defaults(handler=run_slices)
    return parser


def run_slices(args: argparse.Namespace) -> int:
    """Handler of ``slicefeed slices``; returns the exit status."""
    try:
        nodes, available, gcs = _query_cluster(args.address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = args.address or os.environ.get("RAY_ADDRESS") or "auto"
        print(
            f"slicefeed slices: cannot connect to the Ray cluster at {where!r}: {e}\n"
            "Pass --address HOST:PORT of the head's GCS (or set RAY_ADDRESS).",
            file=sys.stderr,
        )
        return 2
    slices = list_slices(nodes, available)
    if args.json:
        print(
            json.dumps(
                {
                    "address": gcs,
                    "slices": [s.to_dict() for s in slices],
                    "incomplete": [s.name for s in slices if not s.complete],
                },
                indent=2,
            )
        )
    else:
        print(format_table(slices))
    if args.fail_on_incomplete and any(not s.complete for s in slices):
        return 1
    return 0

