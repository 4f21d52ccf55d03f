"""Real services for the test suite: a GCS emulator server and helpers.

Imported by ``tests/conftest.py``; also usable from helper processes that the
tests spawn (multi-host JAX, killed writers). Nothing here mocks slicefeed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    """A free TCP port on loopback."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def put_bytes(uri: str, data: bytes | str) -> None:
    """Writes ``data`` (str is UTF-8 encoded) to ``uri`` on any storage, creating folders."""
    from slicefeed.connectors import resolve_filesystem

    r = resolve_filesystem(uri)
    r.fs.makedirs(r.path.rsplit("/", 1)[0], exist_ok=True)
    r.fs.pipe_file(r.path, data.encode() if isinstance(data, str) else data)
