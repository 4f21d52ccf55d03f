"""Checking shards against their manifest: sizes, row counts, SHA-256.

What :func:`read_dataset` and ``slicefeed inspect`` check:

- always: every listed shard exists and has the manifest's size (one listing
  of the prefix), and its Parquet footer parses and has the manifest's row
  count (one small ranged read per shard, on a thread pool; Ray Data reads
  the footers anyway);
- with ``verify=True``: every shard's SHA-256 (reads every byte).

The first shard (in manifest order) that differs is named in a
:class:`ShardMismatchError`; a shard whose footer does not parse (truncated,
not Parquet) is a :class:`CorruptFileError` naming it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from typing import Any

from slicefeed.connectors._errors import CorruptFileError, ShardMismatchError
from slicefeed.connectors._fs import ResolvedPath
from slicefeed.connectors._manifest import Manifest, ManifestFile

_THREADS = 16
_CHUNK = 8 << 20


def _sizes(target: ResolvedPath) -> dict[str, int]:
    kwargs: dict[str, Any] = {"refresh": True} if target.protocol == "gs" else {}
    try:
        entries = target.fs.ls(target.path, detail=True, **kwargs)
    except FileNotFoundError:
        return {}
    return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries if e.get("type") != "directory"}


def check_sizes(target: ResolvedPath, manifest: Manifest) -> None:
    """Every listed shard exists with the manifest's size.

    Raises:
        FileNotFoundError: naming a missing shard.
        ShardMismatchError: naming the first shard of another size.
    """
    sizes = _sizes(target)
    for f in manifest.files:
        if f.path not in sizes:
            raise FileNotFoundError(
                f"{target.join(f.path).uri}: a file listed in version {manifest.version} of the "
                "manifest is missing. The dataset was modified after it was committed (or "
                "vacuumed under this reader); rewrite it with --overwrite."
            )
        if sizes[f.path] != f.num_bytes:
            raise ShardMismatchError(
                f"{target.join(f.path).uri}: {sizes[f.path]} bytes, the manifest says "
                f"{f.num_bytes}. The shard was replaced or truncated after the commit; "
                "rewrite the dataset with --overwrite."
            )


def _footer_rows(target: ResolvedPath, f: ManifestFile) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    loc = target.join(f.path)
    try:
        with loc.fs.open(loc.path, "rb") as fh:
            return pq.ParquetFile(fh).metadata.num_rows
    except (pa.ArrowException, OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorruptFileError(
            f"{loc.uri}: not a readable Parquet file ({str(e)[:200]}); it is listed in the "
            "manifest, so it was damaged after the commit. Rewrite the dataset with --overwrite."
        ) from None


def check_rows(target: ResolvedPath, manifest: Manifest) -> None:
    """Every shard's footer parses and has the manifest's row count (footers only).

    Raises:
        ShardMismatchError: naming the first shard whose row count differs.
        CorruptFileError: naming a shard whose footer does not parse.
    """
    files = list(manifest.files)
    if not files:
        return
    with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(files))) as pool:
        rows = list(pool.map(lambda f: _footer_rows(target, f), files))
    for f, n in zip(files, rows):
        if n != f.num_rows:
            raise row_mismatch(target.join(f.path).uri, n, f.num_rows)


def row_mismatch(uri: str, got: int, expected: int) -> ShardMismatchError:
    return ShardMismatchError(
        f"{uri}: {got} rows, the manifest says {expected}. The shard was replaced after the "
        "commit; rewrite the dataset with --overwrite."
    )


def shard_sha256(target: ResolvedPath, name: str) -> str:
    """SHA-256 of the file ``name`` in the dataset, streamed in chunks."""
    loc = target.join(name)
    h = hashlib.sha256()
    with loc.fs.open(loc.path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_checksums(target: ResolvedPath, manifest: Manifest) -> None:
    """Every shard's SHA-256 equals the manifest's (reads every byte, on a thread pool).

    Raises:
        ShardMismatchError: naming the first shard (in manifest order) that differs.
    """
    files = list(manifest.files)
    if not files:
        return
    with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(files))) as pool:
        digests = list(pool.map(lambda f: shard_sha256(target, f.path), files))
    for f, d in zip(files, digests):
        if d != f.sha256:
            raise ShardMismatchError(
                f"{target.join(f.path).uri}: SHA-256 {d[:16]}... differs from the manifest's "
                f"{f.sha256[:16]}...: the shard's bytes changed after the commit. Rewrite the "
                "dataset with --overwrite."
            )


def verify_shards(target: ResolvedPath, manifest: Manifest, *, checksums: bool = False) -> None:
    """Sizes, then row counts, then (with ``checksums``) SHA-256 of every shard."""
    check_sizes(target, manifest)
    check_rows(target, manifest)
    if checksums:
        check_checksums(target, manifest)
