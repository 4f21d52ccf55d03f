"""A fault-injecting HTTP reverse proxy on loopback, for storage fault tests.

Put it in front of the GCS emulator and point gcsfs at it
(``storage_options={"endpoint_url": proxy.endpoint}``). At a configured,
seeded rate it answers a request with 503 or 429 (without forwarding it),
resets the connection before answering (without forwarding), forwards the
request and resets the connection half way through the response body, or
forwards it after a delay. Paths matching a pattern can be forced to a fixed
status (e.g. 403) every time. Everything injected is counted.

The faults happen at the network edge: gcsfs, pyarrow and Ray Data run
unpatched. The proxy is bounded: it stops by itself after ``lifetime_s`` and
every socket it opens has a timeout.

Example::

    with FaultProxy(gcs.host, rate=0.1, seed=7) as proxy:
        fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=proxy.endpoint)
        ...
        assert proxy.injected_total > 0
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from typing import Self

#: Fault kinds the proxy can inject at random.
FAULTS = ("503", "429", "reset_before", "reset_mid", "delay")

# Hop-by-hop headers (RFC 9110 7.6.1) are not forwarded; bodies are re-framed
# with Content-Length.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


class FaultProxy:
    """A threaded reverse proxy that injects HTTP faults at a seeded rate.

    Args:
        upstream: ``host:port`` of the real server (e.g. ``GCSEmulator.host``).
        rate: Probability in [0, 1] that a request (not matched by ``force``)
            gets a random fault from ``faults``.
        faults: The fault kinds to draw from (subset of :data:`FAULTS`).
        seed: Seed of the fault draw. Draws happen in request arrival order.
        delay_s: How long a ``delay`` fault holds the request before forwarding.
        force: ``[(regex, status), ...]``: a request whose method + path
            (URL-decoded, e.g. ``"GET /storage/v1/b/bkt/o/key"``) matches a
            regex is answered with that status every time, not forwarded.
        max_faults: Stop injecting random faults after this many (None: no cap).
        lifetime_s: The proxy shuts itself down after this many seconds.
        upstream_timeout_s: Socket timeout towards the upstream server and
            towards clients.
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        faults: tuple[str, ...] = FAULTS,
        seed: int = 0,
        delay_s: float = 0.5,
        force: list[tuple[str, int]] | None = None,
        max_faults: int | None = None,
        lifetime_s: float = 300.0,
        upstream_timeout_s: float = 30.0,
    ):
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"faults: unknown kinds {sorted(unknown)}; allowed: {FAULTS}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.upstream = upstream
        self.rate = rate
        self.faults = tuple(faults)
        self.delay_s = delay_s
        self.force = [(re.compile(p), int(s)) for p, s in (force or [])]
        self.max_faults = max_faults
        self.lifetime_s = lifetime_s
        self.upstream_timeout_s = upstream_timeout_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        #: Count of injected faults by kind ("503", "429", "reset_before",
        #: "reset_mid", "delay", "forced_<status>").
        self.injected: collections.Counter[str] = collections.Counter()
        #: Every request seen, as ``"METHOD /decoded/path"`` (forced ones too).
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # -- lifecycle ---------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "FaultProxy not started"
        return self._server.server_address[1]

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` of the proxy."""
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: pass as gcsfs ``endpoint_url``."""
        return f"http://{self.host}"

    @property
    def injected_total(self) -> int:
        return sum(self.injected.values())

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name=f"FaultProxy:{self.port}",
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- decisions ---------------------------------------------------------

    def _decide(self, request: str) -> str | None:
        """The fault for ``request`` ("METHOD /path"), or None to forward it."""
        with self._lock:
            self.requests.append(request)
            for pattern, status in self.force:
                if pattern.search(request):
                    self.injected[f"forced_{status}"] += 1
                    return f"forced_{status}"
            draw = self._rng.random()
            kind = self._rng.choice(self.faults) if self.faults else None
            capped = self.max_faults is not None and self._random_total() >= self.max_faults
            if kind is None or capped or draw >= self.rate:
                return None
            self.injected[kind] += 1
            return kind

    def _random_total(self) -> int:
        return sum(v for k, v in self.injected.items() if not k.startswith("forced_"))


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    _head_length: str | None = None
    protocol_version = "HTTP/1.1"  # keep-alive, as gcsfs's aiohttp session expects

    def log_message(self, format, *args):
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.owner.upstream_timeout_s)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers end with an empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        # SO_LINGER 0: close() sends RST, which the client sees as a reset.
        try:
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        except OSError:
            pass
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        self.connection.close()

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if self.command == "HEAD":
            # No body; the upstream's Content-Length (if any) is kept as is.
            self.send_header("Content-Length", self._head_length or "0")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int) -> None:
        reason = http.client.responses.get(status, "Error")
        body = json.dumps(
            {"error": {"code": status, "message": f"{reason} (injected by FaultProxy)"}}
        ).encode()
        headers = [("Content-Type", "application/json")]
        if status in (429, 503):
            headers.append(("Retry-After", "0"))
        self._send(status, headers, body)

    def _handle(self) -> None:
        body = self._body()
        target = urllib.parse.unquote(self.path)
        fault = self.owner._decide(f"{self.command} {target}")
        if fault is not None and fault.startswith("forced_"):
            return self._error(int(fault.removeprefix("forced_")))
        if fault in ("503", "429"):
            return self._error(int(fault))
        if fault == "reset_before":
            return self._reset()
        if fault == "delay":
            time.sleep(self.owner.delay_s)
        status, headers, payload = self._forward(body)
        if fault == "reset_mid":
            # Headers promise the whole body; half of it arrives, then RST.
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            return self._reset()
        self._send(status, headers, payload)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.owner.upstream, timeout=self.owner.upstream_timeout_s)
        try:
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP
            }
            headers["Host"] = self.owner.upstream
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            self._head_length = resp.getheader("Content-Length")
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            return resp.status, out, payload
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError, OSError):
            self.close_connection = True
