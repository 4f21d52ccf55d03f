"""resolve_filesystem / expand_paths over local disk and the GCS emulator."""

from __future__ import annotations

import pytest

from slicefeed.connectors import expand_paths, resolve_filesystem
from tests._harness import put_bytes


def _touch(uri: str, data: bytes = b"x") -> None:
    put_bytes(uri, data)


def test_resolve_protocols(tmp_path):
    assert resolve_filesystem(str(tmp_path)).protocol == "file"
    r = resolve_filesystem(f"file://{tmp_path}")
    assert r.protocol == "file" and r.path == str(tmp_path)
    m = resolve_filesystem("memory://bucket/x")
    assert m.protocol == "memory"


def test_gcs_resolves_to_gcsfs(gcs):
    r = resolve_filesystem("gs://some-bucket/a/b/")
    assert type(r.fs).__name__.endswith("GCSFileSystem")
    assert r.path == "some-bucket/a/b" and r.uri == "gs://some-bucket/a/b"


def test_glob_and_directory_expand(base_uri):
    for name in ["raw/a.parquet", "raw/b.parquet", "raw/c.json", "raw/_manifest.json"]:
        _touch(f"{base_uri}/{name}")
    globbed = expand_paths(resolve_filesystem(f"{base_uri}/raw/*.parquet"))
    assert [p.rsplit("/", 1)[1] for p in globbed] == ["a.parquet", "b.parquet"]
    listed = expand_paths(resolve_filesystem(f"{base_uri}/raw"))
    assert [p.rsplit("/", 1)[1] for p in listed] == ["a.parquet", "b.parquet", "c.json"]
    only = expand_paths(resolve_filesystem(f"{base_uri}/raw"), suffixes=(".json",))
    assert [p.rsplit("/", 1)[1] for p in only] == ["c.json"]


def test_missing_path_names_uri(base_uri):
    with pytest.raises(FileNotFoundError, match="No file exists at .*nothing-here"):
        expand_paths(resolve_filesystem(f"{base_uri}/nothing-here"))
    with pytest.raises(FileNotFoundError, match=r"matches the pattern .*\*\.parquet"):
        expand_paths(resolve_filesystem(f"{base_uri}/*.parquet"))


def test_key_file_must_exist_and_is_not_echoed(tmp_path):
    with pytest.raises(FileNotFoundError, match="service-account key file") as e:
        resolve_filesystem("gs://b/p", credentials=tmp_path / "secret-key.json")
    assert "secret-key" not in str(e.value)
    with pytest.raises(ValueError, match="either credentials"):
        resolve_filesystem("gs://b/p", credentials=tmp_path / "k.json", anonymous=True)
