"""Tests of the fault-injecting proxy (tests/_faultproxy.py) against the GCS emulator."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

import pytest

from tests._faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(60)


def _request(host: str, method: str, path: str, body: bytes | None = None):
    conn = http.client.HTTPConnection(host, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _upload(host: str, bucket: str, key: str, data: bytes) -> int:
    q = urllib.parse.urlencode({"uploadType": "media", "name": key})
    status, _ = _request(host, "POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data)
    return status


def _download_path(bucket: str, key: str) -> str:
    return f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}?alt=media"


def test_forwards_requests_and_bodies(gcs, bucket):
    with FaultProxy(gcs.host) as proxy:
        assert _upload(proxy.host, bucket, "dir/a b.bin", b"x" * 1000 + b"end") == 200
        # The object reached the real emulator.
        status, data = _request(gcs.host, "GET", _download_path(bucket, "dir/a b.bin"))
        assert (status, data) == (200, b"x" * 1000 + b"end")
        # And reads back through the proxy, keep-alive or not.
        status, data = _request(proxy.host, "GET", _download_path(bucket, "dir/a b.bin"))
        assert (status, data) == (200, b"x" * 1000 + b"end")
        assert proxy.injected_total == 0
        assert any(r.startswith("POST /upload/storage/v1/b/") for r in proxy.requests)


@pytest.mark.parametrize("status", [503, 429])
def test_error_status_faults_are_not_forwarded(gcs, bucket, status):
    with FaultProxy(gcs.host, rate=1.0, faults=(str(status),)) as proxy:
        got, body = _request(proxy.host, "GET", f"/storage/v1/b/{bucket}/o")
        assert got == status
        assert json.loads(body)["error"]["code"] == status
        # An upload that was answered with a fault never reached the emulator.
        assert _upload(proxy.host, bucket, "k", b"data") == status
        assert proxy.injected[str(status)] == 2
    got, _ = _request(gcs.host, "GET", _download_path(bucket, "k"))
    assert got == 404


def test_reset_before_response(gcs, bucket):
    with FaultProxy(gcs.host, rate=1.0, faults=("reset_before",)) as proxy:
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            _request(proxy.host, "GET", f"/storage/v1/b/{bucket}/o")
        assert proxy.injected["reset_before"] == 1


def test_reset_mid_response_truncates_body(gcs, bucket):
    _upload(gcs.host, bucket, "big", b"0123456789" * 1000)
    with FaultProxy(gcs.host, rate=1.0, faults=("reset_mid",)) as proxy:
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            _request(proxy.host, "GET", _download_path(bucket, "big"))
        assert proxy.injected["reset_mid"] == 1


def test_delay(gcs, bucket):
    with FaultProxy(gcs.host, rate=1.0, faults=("delay",), delay_s=0.6) as proxy:
        t0 = time.monotonic()
        status, _ = _request(proxy.host, "GET", f"/storage/v1/b/{bucket}/o")
        assert status == 200
        assert time.monotonic() - t0 >= 0.6
        assert proxy.injected["delay"] == 1


def test_forced_status_for_matching_paths_only(gcs, bucket):
    _upload(gcs.host, bucket, "secret/x", b"s")
    _upload(gcs.host, bucket, "public/x", b"p")
    with FaultProxy(gcs.host, force=[(r"/o/secret/", 403)]) as proxy:
        status, body = _request(proxy.host, "GET", _download_path(bucket, "secret/x"))
        assert status == 403 and b"Forbidden" in body
        assert _request(proxy.host, "GET", _download_path(bucket, "public/x")) == (200, b"p")
        assert proxy.injected == {"forced_403": 1}


def test_rate_is_seeded_and_roughly_right(gcs, bucket):
    def run(seed: int) -> list[int]:
        with FaultProxy(gcs.host, rate=0.25, faults=("503", "429"), seed=seed) as proxy:
            statuses = [
                _request(proxy.host, "GET", f"/storage/v1/b/{bucket}")[0] for _ in range(120)
            ]
            assert proxy.injected_total == sum(s != 200 for s in statuses)
            return statuses

    a, b, c = run(1), run(1), run(2)
    assert a == b  # same seed, same sequence of faults
    assert a != c
    assert 15 <= sum(s != 200 for s in a) <= 45  # 25% of 120 = 30


def test_max_faults_caps_random_faults(gcs, bucket):
    with FaultProxy(gcs.host, rate=1.0, faults=("503",), max_faults=3) as proxy:
        statuses = [_request(proxy.host, "GET", f"/storage/v1/b/{bucket}")[0] for _ in range(6)]
    assert statuses == [503, 503, 503, 200, 200, 200]


def test_stops_by_itself(gcs):
    proxy = FaultProxy(gcs.host, lifetime_s=0.3).start()
    host = proxy.host
    assert _request(host, "GET", "/storage/v1/b")[0] == 200
    time.sleep(1.0)
    with pytest.raises(ConnectionError):
        _request(host, "GET", "/storage/v1/b")
    proxy.stop()  # idempotent


def test_rejects_unknown_fault_kind(gcs):
    with pytest.raises(ValueError, match="unknown kinds"):
        FaultProxy(gcs.host, faults=("teapot",))
