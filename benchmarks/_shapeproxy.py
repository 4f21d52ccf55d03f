"""A shaping HTTP reverse proxy on loopback: object storage's latency and
per-connection bandwidth in front of the (slow) GCS emulator.

- Every response's first byte is held back ``delay_s`` after its request arrived
  (a store's time to first byte).
- Each connection's body bytes are paced to at most ``bandwidth`` bytes/s.
- Object reads (``GET ...?alt=media``, with or without ``Range``) are served
  from memory after the first read of that object, which fetches it whole from
  the upstream; ranges are answered ``206`` with ``Content-Range`` as GCS does.
  So the measurement is of the client, not of the emulator (~50 MB/s here).
  A write through the proxy drops the written object from memory.
- Every request is counted by object and kind: ``data`` (object bytes),
  ``metadata`` (object resource ``GET``/``HEAD``, listings) or ``other``.

Not shared with ``tests/_faultproxy.py``: that one injects faults and forwards
every request; this one answers reads itself and shapes timing. Benchmarks do not
import the test suite.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import re
import threading
import time
import urllib.parse
from typing import Self

_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "content-range",
}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_CHUNK = 64 << 10


def classify(method: str, target: str) -> tuple[str, str | None]:
    """``(kind, object)`` of a GCS JSON API request; ``object`` is ``bucket/name``
    (a listing: ``bucket/prefix``), or None."""
    path, _, query = target.partition("?")
    path = urllib.parse.unquote(path)
    params = urllib.parse.parse_qs(query)
    m = re.search(r"/b/([^/]+)/o(?:/(.*))?$", path)
    if m is None:
        return ("metadata" if method in ("GET", "HEAD") else "other"), None
    bucket, name = m.group(1), m.group(2)
    if name is None:  # listing or upload
        if method == "GET":
            return "metadata", f"{bucket}/{params.get('prefix', [''])[0]}"
        return "other", f"{bucket}/{params.get('name', [''])[0]}"
    if method == "GET" and params.get("alt") == ["media"]:
        return "data", f"{bucket}/{name}"
    if method in ("GET", "HEAD"):
        return "metadata", f"{bucket}/{name}"
    return "other", f"{bucket}/{name}"


class ShapingProxy:
    """See the module docstring. ``delay_s`` and ``bandwidth`` may be changed
    while it runs (they apply to requests arriving afterwards)."""

    def __init__(self, upstream: str, *, delay_s: float = 0.030,
                 bandwidth: float = 200e6, timeout_s: float = 120.0):
        self.upstream = upstream
        self.delay_s = delay_s
        self.bandwidth = bandwidth
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, list[tuple[str, str]]]] = {}
        self._fetching: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)
        #: (kind, object) -> count, since the last :meth:`reset_counts`.
        self.counts: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.bytes_sent = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ShapingProxy:
        owner = self

        class Handler(_Handler):
            proxy = owner

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                         daemon=True, name="ShapingProxy").start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.bytes_sent = 0

    def per_object(self, suffix: str = ".parquet") -> dict[str, dict[str, int]]:
        """Counts by kind for each object whose name ends with ``suffix``."""
        out: dict[str, dict[str, int]] = collections.defaultdict(dict)
        with self._lock:
            for (kind, obj), n in self.counts.items():
                if obj is not None and obj.endswith(suffix):
                    out[obj][kind] = out[obj].get(kind, 0) + n
        return dict(out)

    def _object(self, key: str, path: str) -> tuple[int, bytes, list[tuple[str, str]]]:
        with self._fetching[key]:
            held = self._objects.get(key)
            if held is not None:
                return 200, *held
            conn = http.client.HTTPConnection(self.upstream, timeout=self.timeout_s)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
                headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            finally:
                conn.close()
            if resp.status != 200:
                return resp.status, body, headers
            self._objects[key] = (body, headers)
            return 200, body, headers


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: ShapingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.proxy.timeout_s)
        self._sent = 0  # body bytes paced on this connection
        self._pace_t0 = None

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self) -> None:
        t_arrive = time.perf_counter()
        body = self._body()
        p = self.proxy
        kind, obj = classify(self.command, self.path)
        with p._lock:
            p.counts[(kind, obj)] += 1
        if kind == "data":
            status, payload, headers = self._read(obj)
        else:
            if kind == "other" and obj is not None:
                p._objects.pop(obj, None)
            status, headers, payload = self._forward(body)
        wait = p.delay_s - (time.perf_counter() - t_arrive)
        if wait > 0:
            time.sleep(wait)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self._paced(payload)

    def _read(self, obj: str) -> tuple[int, bytes, list[tuple[str, str]]]:
        path = self.path
        status, data, headers = self.proxy._object(obj, path)
        if status != 200:
            return status, data, headers
        rng = self.headers.get("Range")
        m = _RANGE.match(rng.strip()) if rng else None
        if not m:
            return 200, data, headers
        size = len(data)
        a, b = m.group(1), m.group(2)
        if a == "":
            start, end = max(0, size - int(b)), size - 1
        else:
            start, end = int(a), min(int(b) if b else size - 1, size - 1)
        if start >= size or start > end:
            return 416, b"", [("Content-Range", f"bytes */{size}")]
        return 206, data[start:end + 1], headers + [
            ("Content-Range", f"bytes {start}-{end}/{size}")]

    def _paced(self, payload: bytes) -> None:
        rate = self.proxy.bandwidth
        view = memoryview(payload)
        if self._pace_t0 is None:
            self._pace_t0, self._sent = time.perf_counter(), 0
        else:  # a connection idle for a while does not bank credit
            idle_floor = time.perf_counter() - self._sent / rate
            self._pace_t0 = max(self._pace_t0, idle_floor)
        for i in range(0, len(view), _CHUNK):
            piece = view[i:i + _CHUNK]
            self.wfile.write(piece)
            self._sent += len(piece)
            ahead = self._pace_t0 + self._sent / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        with self.proxy._lock:
            self.proxy.bytes_sent += len(payload)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.proxy.upstream, timeout=self.proxy.timeout_s)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Host"] = self.proxy.upstream
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":
                payload = b""
            return resp.status, out, payload
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError, OSError):
            self.close_connection = True
