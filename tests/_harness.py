"""Real services for the test suite: a GCS emulator server and helpers.

Imported by ``tests/conftest.py``; also usable from helper processes that the
tests spawn (multi-host JAX, killed writers). Nothing here mocks slicefeed.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

# Ports handed out by this process; never handed out twice.
_HANDED_OUT: set[int] = set()
# Ray's worker processes take ports 10002-19999 by default.
_FIXED_PORT_FLOOR = 20000


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A TCP port on loopback that is free now and stays out of others' way.

    A port the kernel picks (``bind(0)``) comes from the ephemeral range, and
    the kernel hands the same range to every outgoing connection and every
    other ``bind(0)``: between this call and the moment a server binds the
    port, a Ray process on the machine can take it ("Address already in use").
    So ports come from below the ephemeral range and above Ray's worker-port
    range, checked free by a bind, and never twice from one process. Where
    the machine leaves no such range, the kernel picks.
    """
    floor = _ephemeral_floor()
    if floor - _FIXED_PORT_FLOOR >= 1000:
        rng = random.Random()
        for _ in range(200):
            port = rng.randrange(_FIXED_PORT_FLOOR, floor)
            if port in _HANDED_OUT:
                continue
            with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _HANDED_OUT.add(port)
    return port


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Waits until ``url`` answers any HTTP status."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError as e:  # refused while starting
            last = e
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s: {last}")


class GCSEmulator:
    """``gcp-storage-emulator`` running as a subprocess on a loopback port.

    Started through ``tests/_gcs_emulator.py``, which makes uploads honour
    ``ifGenerationMatch`` as real GCS does.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.endpoint = f"http://{self.host}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> GCSEmulator:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                # The stock emulator, made to honour ifGenerationMatch.
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gcs_emulator.py"),
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--in-memory",
                "--quiet",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_http(f"{self.endpoint}/storage/v1/b")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def create_bucket(self, name: str) -> None:
        import gcsfs

        fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=self.endpoint)
        fs.mkdir(name)


def configure_process_env() -> None:
    """Environment every test process (and the Ray workers it starts) needs.

    Must run before jax, ray or gcsfs is imported.
    """
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Ray 2.60 token auth breaks nodes joining on loopback (docs/architecture.md).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # gcsfs probes a gRPC control plane per bucket unless this is off.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    # Ray Train's controller sees a worker group start and finish on its next poll
    # (every 2 s by default): each JaxTrainer fit waited up to that much longer.
    # Propagated by Ray Train from the driver to its controller.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


# Set by the session's ``ray_cluster`` fixture: the address CLI subprocesses join.
SESSION_RAY_ENV = "SLICEFEED_TEST_RAY_ADDRESS"


def run_slicefeed(
    *args: str, env: dict | None = None, timeout: float = 240, own_ray: bool = False
) -> subprocess.CompletedProcess:
    """Runs the ``slicefeed`` console script as a subprocess, as a user would.

    A command that needs Ray joins the session's cluster (``RAY_ADDRESS``, the
    documented way to run against an existing cluster) when the session has
    one, so each run does not pay for starting and stopping a Ray of its own;
    ``own_ray=True`` makes the subprocess start a fresh local Ray, as a user's
    first run on a laptop does. ``env`` entries override everything.
    """
    exe = os.path.join(os.path.dirname(sys.executable), "slicefeed")
    full = dict(os.environ)
    full.pop("RAY_ADDRESS", None)
    full["RAY_DATA_DISABLE_PROGRESS_BARS"] = "1"
    session = full.pop(SESSION_RAY_ENV, None)
    if session and not own_ray:
        full["RAY_ADDRESS"] = session
    full.update(env or {})
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=full)


def put_bytes(uri: str, data: bytes | str) -> None:
    """Writes ``data`` (str is UTF-8 encoded) to ``uri`` on any storage, creating folders."""
    from slicefeed.connectors import resolve_filesystem

    r = resolve_filesystem(uri)
    r.fs.makedirs(r.path.rsplit("/", 1)[0], exist_ok=True)
    r.fs.pipe_file(r.path, data.encode() if isinstance(data, str) else data)
