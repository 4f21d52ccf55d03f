"""Credentials never show up in logs, error messages, reprs or written data.

A throwaway service-account key (a real RSA key generated here, with marker
strings in its id and e-mail) is used against the GCS emulator; its token
endpoint is a tiny local server that hands out an access token with its own
marker. Every place a secret could leak is searched for all the markers and
for the key file's path.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import traceback

import pytest

from slicefeed.connectors import resolve_filesystem
from tests._faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(120)

KEY_ID_MARK = "KEYID-0f9e8d7c6b5a"
ACCESS_MARK = "ya29.ACCESS-TOKEN-MARKER-5e4d3c2b1a"


@pytest.fixture
def token_server():
    """An OAuth2 token endpoint that grants ACCESS_MARK to any JWT assertion."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(
                {"access_token": ACCESS_MARK, "expires_in": 3600, "token_type": "Bearer"}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


@pytest.fixture
def key_file(tmp_path, token_server):
    """A throwaway service-account JSON key; returns (path, secret strings)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    key = {
        "type": "service_account",
        "project_id": "sf-test",
        "private_key_id": KEY_ID_MARK,
        "private_key": pem,
        "client_email": "sf-secret-test@sf-test.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_server,
    }
    d = tmp_path / "secret dir"
    d.mkdir()
    path = d / "sa-key-7c1d.json"
    path.write_text(json.dumps(key))
    pem_body = pem.splitlines()[5]  # a line from the middle of the key material
    return str(path), [KEY_ID_MARK, pem_body, "BEGIN PRIVATE KEY", ACCESS_MARK, str(path),
                       "sa-key-7c1d"]


def _assert_clean(text: str, secrets: list[str], where: str) -> None:
    for s in secrets:
        assert s not in text, f"secret {s[:12]!r}... leaked into {where}"


def _full_error_text(e: BaseException) -> str:
    # Message, notes and the whole chain of causes/contexts with tracebacks.
    return "".join(traceback.format_exception(e)) + repr(e)


def test_key_file_is_used_and_never_leaks(gcs, bucket, key_file, caplog):
    path, secrets = key_file
    caplog.set_level(logging.DEBUG)  # every logger, including gcsfs and google.auth
    with FaultProxy(gcs.host, force=[(r"/o/private/", 403)]) as proxy:
        rp = resolve_filesystem(
            f"gs://{bucket}/data", credentials=path,
            storage_options={"endpoint_url": proxy.endpoint},
        )
        # Works with the key (the emulator accepts the bearer token).
        rp.fs.pipe(f"{bucket}/data/ok.txt", b"hello")
        assert rp.fs.cat_file(f"{bucket}/data/ok.txt") == b"hello"
        # A permanent failure: the message names the object and status only.
        with pytest.raises(PermissionError) as e403:
            rp.fs.cat_file(f"{bucket}/private/x")
        with pytest.raises(FileNotFoundError) as e404:
            rp.fs.cat_file(f"{bucket}/data/missing.txt")
    # The token really was fetched and sent: the secret was in play.
    assert rp.fs.credentials.credentials.token == ACCESS_MARK
    assert "403" in str(e403.value) and f"gs://{bucket}/private/x" in str(e403.value)
    _assert_clean(_full_error_text(e403.value), secrets, "the 403 error")
    _assert_clean(_full_error_text(e404.value), secrets, "the 404 error")
    assert f"{bucket}/data/ok.txt" in caplog.text or "ok.txt" in caplog.text  # logs captured
    _assert_clean(caplog.text, secrets, "logs")
    _assert_clean(repr(rp) + str(rp) + repr(rp.fs), secrets, "repr of ResolvedPath/fs")
    # Nothing of the key lands in the bucket.
    raw = resolve_filesystem(f"gs://{bucket}")
    raw.fs.invalidate_cache()
    for p in raw.fs.find(bucket):
        _assert_clean(p + raw.fs.cat_file(p).decode("latin-1"), secrets, f"object {p}")


def test_broken_key_file_error_names_neither_path_nor_contents(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    d = tmp_path / "keys"
    d.mkdir()
    path = d / "broken-key-3b2a.json"
    marker = "-----BEGIN PRIVATE KEY-----\nNOT-A-REAL-KEY-MARKER-99\n-----END PRIVATE KEY-----\n"
    path.write_text(json.dumps({"type": "service_account", "private_key": marker,
                                "private_key_id": KEY_ID_MARK,
                                "client_email": "a@b.iam.gserviceaccount.com"}))
    with pytest.raises(ValueError, match="service-account key could not be loaded") as e:
        resolve_filesystem("gs://some-bucket/x", credentials=str(path))
    secrets = ["NOT-A-REAL-KEY-MARKER-99", KEY_ID_MARK, str(path), "broken-key-3b2a"]
    _assert_clean(_full_error_text(e.value), secrets, "the key-load error")
    _assert_clean(caplog.text, secrets, "logs")


def test_missing_key_file_error_does_not_echo_the_path(tmp_path):
    path = tmp_path / "nowhere" / "missing-key-5f4e.json"
    with pytest.raises(FileNotFoundError) as e:
        resolve_filesystem("gs://some-bucket/x", credentials=str(path))
    assert "gs://some-bucket/x" in str(e.value)
    _assert_clean(_full_error_text(e.value), [str(path), "missing-key-5f4e"], "the error")


@pytest.mark.timeout(300)
def test_pipeline_run_with_key_keeps_it_out_of_report_manifest_quarantine(
    ray_cluster, gcs, bucket, key_file, caplog
):
    from slicefeed.pipelines import Pipeline

    path, secrets = key_file
    caplog.set_level(logging.DEBUG)
    raw = resolve_filesystem(f"gs://{bucket}/raw/a.jsonl")
    raw.fs.pipe_file(raw.path, b'{"id": 1, "text": "a"}\n{"id": 2, "te\n{"id": 3, "text": "c"}\n')
    storage = {"credentials": path}
    spec = {
        "name": "secret-run",
        "source": {"format": "jsonl", "uri": f"gs://{bucket}/raw", "storage": storage},
        "sink": {"format": "parquet", "uri": f"gs://{bucket}/out", "storage": storage},
        "on_error": "quarantine",
        "max_error_fraction": 0.5,
    }
    report = Pipeline(spec).run()
    assert (report.rows_written, report.rows_quarantined) == (2, 1)
    _assert_clean(json.dumps(report.to_dict(), default=str), secrets, "the run report")
    out = resolve_filesystem(f"gs://{bucket}/out")
    out.fs.invalidate_cache()
    written = out.fs.find(out.path)
    assert any(p.endswith("_report.json") for p in written)
    assert any("/_versions/" in p for p in written)
    assert any("/_quarantine/" in p for p in written)
    for p in written:  # report, manifest, quarantine, shards
        _assert_clean(p + out.fs.cat_file(p).decode("latin-1"), secrets, f"object {p}")
    _assert_clean(caplog.text, secrets, "logs")
    # A failing run: the error names the object, not the key.
    with pytest.raises(Exception) as e:
        Pipeline({**spec, "on_error": "fail", "sink": {**spec["sink"], "uri": f"gs://{bucket}/o2"}}).run()
    assert "a.jsonl" in str(e.value)
    _assert_clean(_full_error_text(e.value), secrets, "the failed run's error")
