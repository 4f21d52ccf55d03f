"""Committed Parquet datasets: shards first, ``_manifest.json`` last.

:func:`write_parquet` runs a Ray Data ``Datasink`` whose write tasks each
encode one Parquet shard in memory, checksum it, and upload it under a
run-unique name; ``on_write_complete`` (on the driver, after every task
succeeded) writes the manifest in a single PUT (GCS) or an atomic rename
(local disk). A run that dies before that leaves shards but no manifest, so
the prefix never looks committed; :func:`read_dataset` reads only the files a
manifest lists, and the next successful commit deletes the strays.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink
from ray.data.datasource.datasink import WriteResult

from slicefeed.connectors._errors import AlreadyCommittedError, MissingColumnError
from slicefeed.connectors._fs import ResolvedPath, resolve_filesystem
from slicefeed.connectors._manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestFile,
    manifest_location,
    read_manifest,
)

logger = logging.getLogger(__name__)

SHARD_PREFIX = "part-"


def _write_bytes(target: ResolvedPath, data: bytes) -> None:
    """Writes ``data`` so a reader sees all of it or nothing."""
    fs = target.fs
    if target.protocol == "file":
        # Ray does not call on_write_start before every plan's write tasks
        # (seen after a sort), so the folder may not exist yet.
        os.makedirs(os.path.dirname(target.path), exist_ok=True)
        tmp = f"{target.path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target.path)
    else:
        # One object PUT: GCS makes an object visible only once fully uploaded.
        fs.pipe_file(target.path, data)


class CommittedParquetDatasink(Datasink[dict]):
    """Writes one checksummed Parquet shard per write task, then the manifest.

    Args:
        target: The dataset prefix.
        run_id: Unique id of this run; part of every shard name.
        fingerprint: Fingerprint of the producing pipeline (stored in the manifest).
        metadata: Extra JSON-serialisable manifest metadata.
        compression: Parquet codec.
        min_rows_per_file: Passed to Ray as the minimum rows per write task.
        row_group_size: Maximum rows per Parquet row group.
        before_commit: Called with the manifest about to be written; raising
            aborts the commit (e.g. too many bad records).
    """

    def __init__(
        self,
        target: ResolvedPath,
        *,
        run_id: str,
        fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
        compression: str = "snappy",
        min_rows_per_file: int | None = None,
        row_group_size: int | None = None,
        before_commit: Callable[[Manifest], None] | None = None,
    ):
        self.target = target
        self.before_commit = before_commit
        self.run_id = run_id
        self.fingerprint = fingerprint
        self.metadata = dict(metadata or {})
        self.compression = compression
        self.row_group_size = row_group_size
        self._min_rows_per_file = min_rows_per_file
        self.manifest: Manifest | None = None

    def get_name(self) -> str:
        return "WriteCommittedParquet"

    @property
    def min_rows_per_write(self) -> int | None:
        return self._min_rows_per_file

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self.target.fs.makedirs(self.target.path, exist_ok=True)

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict | None:
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return None
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
        sink = pa.BufferOutputStream()
        pq.write_table(
            table, sink, compression=self.compression, row_group_size=self.row_group_size
        )
        data = sink.getvalue().to_pybytes()
        name = f"{SHARD_PREFIX}{ctx.task_idx:05d}-{self.run_id}.parquet"
        _write_bytes(self.target.join(name), data)
        return {
            "task_idx": ctx.task_idx,
            "path": name,
            "num_rows": table.num_rows,
            "num_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "schema": table.schema.remove_metadata().serialize().to_pybytes(),
        }

    def on_write_complete(self, write_result: WriteResult[dict | None]) -> None:
        returns = sorted((r for r in write_result.write_returns if r), key=lambda r: r["task_idx"])
        schema = _common_schema(returns, self.target.uri)
        files = tuple(
            ManifestFile(r["path"], r["num_rows"], r["num_bytes"], r["sha256"]) for r in returns
        )
        manifest = Manifest(
            files=files,
            schema=schema if schema is not None else pa.schema([]),
            fingerprint=self.fingerprint,
            metadata={**self.metadata, "run_id": self.run_id},
        )
        if self.before_commit is not None:
            self.before_commit(manifest)
        _write_bytes(manifest_location(self.target), manifest.to_json().encode("utf-8"))
        self.manifest = manifest
        _delete_strays(self.target, keep={f.path for f in files})

    def on_write_failed(self, error: Exception) -> None:
        logger.warning(
            "Writing %s failed; nothing was committed. Shards of run %s stay until the "
            "next successful run removes them.",
            self.target.uri,
            self.run_id,
        )


def _common_schema(returns: list[dict], uri: str) -> pa.Schema | None:
    schema: pa.Schema | None = None
    for r in returns:
        s = pa.ipc.read_schema(pa.py_buffer(r["schema"]))
        if schema is None:
            schema = s
        elif not s.equals(schema):
            diff = [
                f"{f.name}: {schema.field(f.name).type if f.name in schema.names else 'missing'}"
                f" vs {f.type}"
                for f in s
                if f.name not in schema.names or schema.field(f.name).type != f.type
            ]
            raise ValueError(
                f"{uri}: shards of this write have different schemas ({'; '.join(diff)}, in "
                f"{r['path']}). Add a `cast` transform so every batch has the same types."
            )
    return schema


def _delete_strays(target: ResolvedPath, *, keep: set[str]) -> None:
    """Removes shards no manifest lists (crashed runs, the replaced dataset)."""
    try:
        names = [p.rsplit("/", 1)[-1] for p in target.fs.ls(target.path, detail=False)]
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(SHARD_PREFIX) and name not in keep:
            try:
                target.fs.rm(target.join(name).path)
            except FileNotFoundError:
                pass


def write_parquet(
    ds: ray.data.Dataset,
    uri: str | os.PathLike[str],
    *,
    fingerprint: str | None = None,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    compression: str = "snappy",
    min_rows_per_file: int | None = None,
    row_group_size: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    before_commit: Callable[[Manifest], None] | None = None,
    **fs_kwargs: Any,
) -> Manifest:
    """Writes ``ds`` as a committed Parquet dataset at ``uri`` and returns its manifest.

    Shards are written first, the manifest last; see the module docstring.

    Args:
        ds: The dataset to write (executed by this call).
        uri: The dataset prefix (``gs://bucket/out``, a local folder).
        fingerprint: Fingerprint of the producing pipeline, stored in the manifest.
        metadata: Extra JSON-serialisable manifest metadata (fit statistics...).
        overwrite: Replace a dataset already committed at ``uri``. Its manifest is
            removed before writing starts, so a crash in between leaves no
            committed dataset rather than a mix of old and new.
        compression: Parquet codec for the shards.
        min_rows_per_file: Minimum rows per shard (Ray buffers rows to reach it).
        row_group_size: Maximum rows per Parquet row group.
        ray_remote_args: Ray options for the write tasks.
        before_commit: Called with the manifest just before it is written;
            raising aborts the commit and leaves the prefix uncommitted.
        **fs_kwargs: Passed to :func:`resolve_filesystem`.

    Raises:
        AlreadyCommittedError: ``uri`` holds a committed dataset and ``overwrite`` is False.
    """
    target = resolve_filesystem(uri, **fs_kwargs)
    loc = manifest_location(target)
    if target.fs.exists(loc.path):
        if not overwrite:
            existing = read_manifest(target)
            raise AlreadyCommittedError(
                f"{target.uri} already holds a committed dataset ({existing.num_rows} rows, "
                f"fingerprint {existing.fingerprint}). Pass overwrite=True (CLI: --overwrite) "
                "to replace it, or write to another prefix."
            )
        target.fs.rm(loc.path)
    sink = CommittedParquetDatasink(
        target,
        run_id=uuid.uuid4().hex[:12],
        fingerprint=fingerprint,
        metadata=metadata,
        compression=compression,
        min_rows_per_file=min_rows_per_file,
        row_group_size=row_group_size,
        before_commit=before_commit,
    )
    ds.write_datasink(sink, ray_remote_args=ray_remote_args)
    if sink.manifest is None:  # Ray skipped on_write_complete: no blocks at all
        sink.on_write_complete(WriteResult(num_rows=0, size_bytes=0, write_returns=[]))
    assert sink.manifest is not None
    return sink.manifest


def read_dataset(
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    provenance: bool = False,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads the committed dataset at ``uri``, through its manifest only.

    Files in the prefix that the manifest does not list (a crashed run's
    shards) are never read.

    Args:
        uri: The dataset prefix.
        columns: Columns to read (projection).
        provenance: Add ``_sf_file`` (shard name) and ``_sf_row`` columns.
        **kwargs: ``credentials``/``anonymous``/``project``/``storage_options`` go to
            :func:`resolve_filesystem`; the rest to ``ray.data.read_parquet``.

    Raises:
        NotCommittedError: ``uri`` has no manifest.
        FileNotFoundError: A file the manifest lists is missing.
    """
    from slicefeed.connectors._readers import ParquetFilesDatasource, _split_kwargs

    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    target = resolve_filesystem(uri, **fs_kwargs)
    manifest = read_manifest(target)
    if columns is not None:
        missing = [c for c in columns if c not in manifest.schema.names]
        if missing:
            raise MissingColumnError(
                f"{target.uri}: column(s) {missing} not in the dataset; available: "
                f"{', '.join(manifest.schema.names)}."
            )
    if not manifest.files:
        return ray.data.from_arrow(manifest.schema.empty_table())
    paths = [target.join(f.path).path for f in manifest.files]
    if provenance:
        return ray.data.read_datasource(
            ParquetFilesDatasource(paths, source=target, columns=columns, provenance=True),
            **ray_kwargs,
        )
    try:
        return ray.data.read_parquet(
            paths, filesystem=target.fs, columns=list(columns) if columns else None, **ray_kwargs
        )
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{target.uri}: a file listed in {MANIFEST_NAME} is missing ({e}). The dataset "
            "was modified after it was committed; rewrite it with overwrite."
        ) from None
