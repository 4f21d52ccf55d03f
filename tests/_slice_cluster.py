"""A multi-node Ray cluster on loopback with simulated TPU slices.

Starts a head node and worker nodes as separate ``ray start --block``
processes, each in its own session (process group), and stops exactly those
processes: never ``ray stop``, which would end every Ray cluster on the machine.
A TPU host is a node with ``TPU: <chips>`` and the four environment variables GKE
sets on TPU pods (``TPU_NAME``, ``TPU_WORKER_ID``, ``TPU_ACCELERATOR_TYPE``,
``TPU_TOPOLOGY``); Ray derives the slice labels and head resource itself, so
``ray.util.tpu`` and ``JaxTrainer`` schedule on it exactly as on GKE
(``/work/shared/SLICE_SIMULATION.md``).

Isolation from other Ray users of the machine:

- every port is a fresh free one (GCS, client server, dashboard agent, ...);
- the cluster has its own ``--temp-dir``, so its ``ray_current_cluster`` file is
  written there and never to ``/tmp/ray/ray_current_cluster`` (a bare
  ``ray.init()`` elsewhere would otherwise try to join this cluster after it is
  gone);
- drivers reach it only through an explicit address (``RAY_ADDRESS``).

Usage::

    with SimulatedCluster() as cluster:
        cluster.start_head()
        cluster.add_cpu_node(num_cpus=2)
        cluster.add_slice("slice-a", topology="4x4", accelerator="v6e")
        cluster.wait_for_nodes()
        subprocess.run([...], env=cluster.driver_env())

Reusable from benchmarks: nothing here depends on pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Self

from tests._harness import free_port

# ``ray`` console script equivalent that works from any venv.
_RAY_CLI = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]

# Object store per node: the minimum Ray accepts comfortably; test data is tiny.
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def _cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "RAY_ADDRESS",  # the node must not join whatever a parent points at
        "TPU_NAME",
        "TPU_WORKER_ID",
        "TPU_ACCELERATOR_TYPE",
        "TPU_TOPOLOGY",
        "TPU_VISIBLE_CHIPS",
    ):
        env.pop(key, None)
    # Ray 2.60 token auth: joining nodes don't present the head's token.
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # No idle Python workers per CPU at startup: on 2 shared cores they slow
    # every other node's registration (which `ray start` gives 30 s, fixed).
    env.setdefault("RAY_prestart_worker_first_driver", "0")
    env.setdefault("RAY_enable_worker_prestart", "0")
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    env.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    env.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    # A Ray worker on a simulated host is a CPU JAX process.
    env["JAX_PLATFORMS"] = "cpu"
    return env


@dataclass
class NodeProc:
    """One ``ray start --block`` process (and its process group)."""

    name: str
    proc: subprocess.Popen
    log_path: str
    env: dict[str, str] = field(repr=False)
    cmd: list[str] = field(repr=False, default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    started: bool = False
    attempts: int = 1

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session=True: the pid leads its group


class SimulatedCluster:
    """Head + worker nodes as OS processes on 127.0.0.1.

    Args:
        temp_dir: Ray temp dir root for all nodes; a fresh short directory
            under /tmp by default (Unix socket paths must stay short).
        object_store_memory: Bytes of object store per node.
    """

    def __init__(
        self,
        *,
        temp_dir: str | None = None,
        object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES,
        max_concurrent_starts: int = 2,
        start_retries: int = 2,
    ):
        self.max_concurrent_starts = max_concurrent_starts
        self.start_retries = start_retries
        self._own_temp_dir = temp_dir is None
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
        self.object_store_memory = object_store_memory
        self.head_port = free_port()
        self.address = f"127.0.0.1:{self.head_port}"
        self.nodes: list[NodeProc] = []
        self._log_dir = os.path.join(self.temp_dir, "node-logs")
        os.makedirs(self._log_dir, exist_ok=True)

    # -- starting ------------------------------------------------------------

    def _start(self, name: str, args: list[str], env_extra: dict[str, str] | None = None) -> NodeProc:
        # `ray start` gives a node a fixed 30 s to register with the GCS; on 2
        # shared cores several nodes starting at once miss it. Bound the
        # number of nodes starting at the same time, and retry a node that
        # gave up (see _poll_starting).
        while sum(1 for n in self.nodes if not n.started) >= self.max_concurrent_starts:
            self._poll_starting()
            time.sleep(0.2)
        log_path = os.path.join(self._log_dir, f"{name}.log")
        # One temp dir per node: nodes on one machine otherwise pick socket
        # names (sockets/plasma_store.N) from a shared directory and collide
        # when they start concurrently. Short names: Unix socket paths are
        # limited to 107 bytes.
        node_dir = os.path.join(self.temp_dir, f"n{len(self.nodes)}")
        cmd = _RAY_CLI + [
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={node_dir}",
            f"--object-store-memory={self.object_store_memory}",
            # The agent's HTTP port has a fixed default that collides when
            # several nodes share one IP; the others default to random ports.
            f"--dashboard-agent-listen-port={free_port()}",
            "--include-log-monitor=false",
            "--disable-usage-stats",
            "--log-style=record",
            *args,
        ]
        env = _cluster_env()
        env.update(env_extra or {})
        node = NodeProc(name=name, proc=None, log_path=log_path, env=env_extra or {}, cmd=cmd)
        node.proc = self._spawn(cmd, env, log_path)
        self.nodes.append(node)
        return node

    @staticmethod
    def _spawn(cmd: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                cmd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _poll_starting(self) -> None:
        """Marks nodes whose `ray start` finished; restarts ones that timed out."""
        for node in self.nodes:
            if node.started:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"ray node {node.name!r} exited with {node.proc.returncode}; "
                        f"log: {node.log_path}\n{self._tail(node.log_path)}"
                    )
                continue
            if node.proc.poll() is None:
                if "Ray runtime started" in self._tail(node.log_path, 4000):
                    node.started = True
                continue
            log = self._tail(node.log_path)
            if "timed out during startup" in log and node.attempts <= self.start_retries:
                # Leave nothing of the failed attempt behind, then try again.
                self._kill_group(node, signal.SIGKILL)
                node.attempts += 1
                env = _cluster_env()
                env.update(node.env)
                node.proc = self._spawn(node.cmd, env, node.log_path)
                continue
            raise RuntimeError(
                f"ray node {node.name!r} exited with {node.proc.returncode} after "
                f"{node.attempts} attempt(s); log: {node.log_path}\n{log}"
            )

    def start_head(self, *, num_cpus: int = 0, resources: dict | None = None, labels: dict | None = None) -> NodeProc:
        """Starts the head node. ``num_cpus=0`` like a KubeRay head: no tasks land on it."""
        args = [
            "--head",
            f"--port={self.head_port}",
            f"--ray-client-server-port={free_port()}",
            "--include-dashboard=false",
            f"--num-cpus={num_cpus}",
        ]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        if labels:
            args.append(f"--labels={json.dumps(labels)}")
        node = self._start("head", args)
        node.labels = dict(labels or {})
        # Workers can only join once the head is up.
        self._wait_started([node])
        return node

    def add_node(
        self,
        name: str,
        *,
        num_cpus: int = 1,
        resources: dict | None = None,
        labels: dict | None = None,
        env: dict[str, str] | None = None,
    ) -> NodeProc:
        """Starts one worker node joining the head."""
        args = [f"--address={self.address}", f"--num-cpus={num_cpus}"]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        if labels:
            args.append(f"--labels={json.dumps(labels)}")
        node = self._start(name, args, env)
        node.labels = dict(labels or {})
        return node

    def add_cpu_node(self, name: str = "cpu-0", *, num_cpus: int = 2, labels: dict | None = None) -> NodeProc:
        """A CPU-only worker node (no TPU resource, no TPU labels)."""
        return self.add_node(name, num_cpus=num_cpus, labels=labels)

    def add_slice(
        self,
        slice_name: str,
        *,
        topology: str = "4x4",
        accelerator: str = "v6e",
        worker_ids: list[int] | None = None,
        num_cpus: int = 1,
    ) -> list[NodeProc]:
        """Starts the hosts of one TPU slice.

        Args:
            slice_name: ``TPU_NAME`` of every host (Ray's ``ray.io/tpu-slice-name``).
            topology: Slice topology, e.g. ``"4x4"``.
            accelerator: TPU generation, e.g. ``"v6e"``.
            worker_ids: Which hosts to start (``TPU_WORKER_ID``); all hosts of
                the topology by default. Fewer hosts make an incomplete slice.
            num_cpus: CPUs per host.
        """
        from slicefeed.pipelines import SliceSpec

        spec = SliceSpec(topology, accelerator)
        ids = list(range(spec.num_hosts)) if worker_ids is None else list(worker_ids)
        hosts = []
        for wid in ids:
            env = {
                "TPU_NAME": slice_name,
                "TPU_WORKER_ID": str(wid),
                "TPU_ACCELERATOR_TYPE": spec.pod_type,
                "TPU_TOPOLOGY": spec.topology,
            }
            hosts.append(
                self.add_node(
                    f"{slice_name}-w{wid}",
                    num_cpus=num_cpus,
                    resources={"TPU": spec.chips_per_host},
                    env=env,
                )
            )
        return hosts

    # -- waiting -------------------------------------------------------------

    def _wait_started(self, nodes: list[NodeProc], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._poll_starting()
            if all(n.started for n in nodes):
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"ray nodes {[n.name for n in nodes if not n.started]} did not start within "
            f"{timeout} s; logs in {self._log_dir}"
        )

    @staticmethod
    def _tail(path: str, n: int = 3000) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _gcs_client(self):
        from ray._raylet import GcsClient

        return GcsClient(address=self.address)

    def alive_nodes(self) -> list[dict]:
        """Alive nodes as GCS reports them: ``{"node_id", "labels", "resources"}``."""
        infos = self._gcs_client().get_all_node_info(timeout=10)
        out = []
        for node_id, info in infos.items():
            if info.state != 0:  # GcsNodeInfo.ALIVE == 0
                continue
            out.append(
                {
                    "node_id": node_id.hex(),
                    "labels": dict(info.labels),
                    "resources": dict(info.resources_total),
                }
            )
        return out

    def wait_for_nodes(self, timeout: float = 90.0) -> list[dict]:
        """Blocks until every started node is alive in the GCS."""
        self._wait_started(self.nodes, timeout)
        deadline = time.monotonic() + timeout
        alive: list[dict] = []
        while time.monotonic() < deadline:
            self._poll_starting()
            try:
                alive = self.alive_nodes()
            except Exception:  # noqa: BLE001 - GCS still starting
                alive = []
            if len(alive) >= len(self.nodes):
                return alive
            time.sleep(0.3)
        raise TimeoutError(
            f"only {len(alive)} of {len(self.nodes)} ray nodes joined {self.address} "
            f"within {timeout} s; logs in {self._log_dir}"
        )

    # -- drivers -------------------------------------------------------------

    def driver_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a driver subprocess that should use this cluster."""
        env = _cluster_env()
        env["RAY_ADDRESS"] = self.address
        env.update(extra or {})
        return env

    # -- stopping ------------------------------------------------------------

    def _our_pids(self) -> list[int]:
        """Processes whose command line names this cluster's temp dir.

        Every Ray process of this cluster (gcs_server, raylet, agents, workers)
        carries ``--temp-dir``/session paths under it, and no other cluster
        uses that directory, so this finds stragglers that left our process
        groups without touching anyone else's Ray.
        """
        pids = []
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            root = self.temp_dir.rstrip("/")
            if any(a == root or a.endswith("=" + root) or root + "/" in a for a in cmdline.split("\0")):
                pids.append(int(entry))
        return pids

    def stop_node(self, node: NodeProc, *, timeout: float = 10.0) -> None:
        """Ends one node's process group (SIGTERM, then SIGKILL)."""
        self._kill_group(node, signal.SIGTERM)
        try:
            node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self._kill_group(node, signal.SIGKILL)
        try:
            node.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    @staticmethod
    def _kill_group(node: NodeProc, sig: int) -> None:
        try:
            os.killpg(node.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """Stops exactly the processes this cluster started; removes its temp dir."""
        # Workers first, head last, so nodes don't spin on a lost GCS.
        for node in reversed(self.nodes):
            self._kill_group(node, signal.SIGTERM)
        # Nothing to flush on a throwaway test cluster: short grace, then KILL.
        deadline = time.monotonic() + 3
        for node in self.nodes:
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for node in self.nodes:
            self._kill_group(node, signal.SIGKILL)
            try:
                node.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for pid in self._our_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.nodes.clear()
        if self._own_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
