"""Committed Parquet datasets: shards first, an immutable manifest version last.

:func:`write_parquet` runs a Ray Data ``Datasink`` whose write tasks each
encode one Parquet shard in memory, checksum it, and upload it under a name
carrying the writer id. After every task succeeded, the driver creates the
next manifest version put-if-absent (:mod:`._commit`): exactly one of several
concurrent writers creates it; the others commit nothing and remove only
their own shards. A run that dies before that leaves shards but no new
version, so readers keep seeing the previous one; :func:`read_dataset` reads
only the files a manifest lists, and cleanup after a later commit (or
``slicefeed vacuum``) removes files no retained version lists and no live
writer owns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink
from ray.data.datasource.datasink import WriteResult

from slicefeed.connectors._commit import (
    SHARD_PREFIX,
    Lease,
    cleanup,
    new_writer_id,
    put_if_absent,
    remove_own,
    set_aside,
    write_atomic,
)
from slicefeed.connectors._errors import (
    AlreadyCommittedError,
    CommitConflictError,
    CorruptManifestError,
    MissingColumnError,
    printable,
)
from slicefeed.connectors._fs import ResolvedPath, resolve_filesystem
from slicefeed.connectors._manifest import (
    InputFile,
    Manifest,
    ManifestFile,
    list_names,
    list_versions,
    now_iso,
    read_manifest,
    version_name,
)
from slicefeed.connectors._parquet import encode_shard
from slicefeed.connectors._verify import verify_shards
from slicefeed.connectors._watch import watching

logger = logging.getLogger(__name__)

__all__ = ["SHARD_PREFIX", "CommittedParquetDatasink", "read_dataset", "write_parquet"]


class CommittedParquetDatasink(Datasink[dict]):
    """Writes one checksummed Parquet shard per write task and collects the manifest.

    The manifest is built in ``on_write_complete`` (driver, after every task
    succeeded); :func:`write_parquet` commits it.

    Args:
        target: The dataset prefix.
        run_id: This writer's id; part of every shard name (``part-<task>-<id>.parquet``).
        fingerprint: Fingerprint of the producing pipeline (stored in the manifest).
        metadata: Extra JSON-serialisable manifest metadata.
        compression: Parquet codec.
        min_rows_per_file: Passed to Ray as the minimum rows per write task.
        row_group_size: Maximum rows per Parquet row group.
        row_group_bytes: Maximum decoded (Arrow) bytes per row group
            (default ``ROW_GROUP_BYTES``, 64 MiB).
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
        row_group_bytes: int | None = None,
        before_commit: Callable[[Manifest], None] | None = None,
        watch: Any = None,
    ):
        self.target = target
        self.watch = watch
        self.before_commit = before_commit
        self.run_id = run_id
        self.fingerprint = fingerprint
        self.metadata = dict(metadata or {})
        self.compression = compression
        self.row_group_size = row_group_size
        self.row_group_bytes = row_group_bytes
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
        # Consuming ``blocks`` runs the stages fused into this task (reads, transforms).
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return None
        name = f"{SHARD_PREFIX}{ctx.task_idx:05d}-{self.run_id}.parquet"
        # A worker that dies here raises nothing; the watch lets the caller
        # name the sink and the shard.
        with watching(self.watch, f"write:{name}", f"writing shard {name} to {self.target.uri}"):
            return self._write(tables, name, ctx)

    def _write(self, tables: list[pa.Table], name: str, ctx: Any) -> dict:
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
        data, groups = encode_shard(
            table, compression=self.compression, row_group_size=self.row_group_size,
            row_group_bytes=self.row_group_bytes,
        )
        # Writer-owned name: a retried task may replace its own shard.
        write_atomic(self.target.join(name), data)
        return {
            "task_idx": ctx.task_idx,
            "path": name,
            "num_rows": table.num_rows,
            "num_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "row_groups": groups,
            "schema": table.schema.remove_metadata().serialize().to_pybytes(),
        }

    def on_write_complete(self, write_result: WriteResult[dict | None]) -> None:
        returns = sorted((r for r in write_result.write_returns if r), key=lambda r: r["task_idx"])
        schema = _common_schema(returns, self.target.uri)
        files = tuple(
            ManifestFile(r["path"], r["num_rows"], r["num_bytes"], r["sha256"],
                         tuple(r["row_groups"]), self.run_id)
            for r in returns
        )
        self.manifest = Manifest(
            files=files,
            schema=schema if schema is not None else pa.schema([]),
            fingerprint=self.fingerprint,
            metadata={**self.metadata, "run_id": self.run_id},
            writer=self.run_id,
        )

    def on_write_failed(self, error: Exception) -> None:
        logger.warning("Writing %s failed; nothing was committed.", self.target.uri)


def _nullable_union(a: pa.Schema, b: pa.Schema) -> pa.Schema | None:
    """``a`` with each column nullable that is nullable in ``b``, where the two
    differ in declared nullability only (same columns, order, types and field
    metadata); else None."""
    if a.names != b.names:
        return None
    fields = []
    for f, g in zip(a, b):
        if not f.with_nullable(True).equals(g.with_nullable(True), check_metadata=True):
            return None
        fields.append(f.with_nullable(f.nullable or g.nullable))
    return pa.schema(fields, metadata=a.metadata)


def _common_schema(returns: list[dict], uri: str) -> pa.Schema | None:
    """The one schema of a write's shards, or ValueError naming where two differ:
    by input file where a shard is one input file's (``input``), else by shard.

    Shards that differ only in a column declared ``not null`` in some and
    nullable in others (Parquet files of two writers) agree: the dataset's
    column is nullable, and each shard keeps its own declaration (readers
    take the manifest's schema, see ``pipelines/_loader/_sources.shard_schema``)."""
    schema: pa.Schema | None = None
    first: dict = {}
    for r in returns:
        s = pa.ipc.read_schema(pa.py_buffer(r["schema"]))
        if schema is None:
            schema, first = s, r
        elif not s.equals(schema) and (union := _nullable_union(schema, s)) is not None:
            schema = union
        elif not s.equals(schema):
            diff, missing = _schema_diff(schema, s)
            more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""

            def where(rec: dict) -> str:
                return (f"input file {printable(rec['input'], 200)}" if rec.get("input")
                        else f"shard {rec['path']}")

            fix = ("Keep the columns every batch has (the source's `options: {columns: "
                   "[...]}` or a `select` transform), or give the inputs the same columns"
                   if missing else
                   "Add a `cast` transform so every batch has the same types")
            raise ValueError(
                f"{uri}: the rows of {where(first)} and of {where(r)} have different types "
                f"({'; '.join(diff[:3])}{more}). {fix}."
            )
    return schema


def _schema_diff(a: pa.Schema, b: pa.Schema) -> tuple[list[str], bool]:
    """How ``b`` differs from ``a``, column by column (``'x': int64 vs double``;
    a column one of them lacks, ``missing``; one declared not null in one of
    them, ``int64 not null vs int64 nullable``), and whether a column is
    missing. Types are bounded like names: a struct's type lists its fields."""

    def described(f: pa.Field, other: pa.Field) -> str:
        kind = printable(str(f.type), 200)
        if f.type != other.type:
            return kind
        return f"{kind} {'nullable' if f.nullable else 'not null'}"

    diff, missing = [], False
    for f in b:
        if f.name not in a.names:
            diff.append(f"'{printable(f.name, 60)}': missing vs {printable(str(f.type), 200)}")
            missing = True
            continue
        g = a.field(f.name)
        if not g.equals(f):
            diff.append(f"'{printable(f.name, 60)}': {described(g, f)} vs {described(f, g)}")
    for g in a:
        if g.name not in b.names:
            diff.append(f"'{printable(g.name, 60)}': {printable(str(g.type), 200)} vs missing")
            missing = True
    return diff or ["the same columns in another order"], missing


def commit_held(target: ResolvedPath, lease: Lease, manifest: Manifest) -> None:
    """Commits ``manifest`` (see :func:`commit_version`) only while this writer
    holds ``lease`` and every shard it lists is there: a writer judged dead
    (paused past its lease's lifetime) may have had its shards removed by a
    cleanup, and a version listing a missing shard is a dataset nobody can read.

    Raises:
        CommitConflictError: the lease was lost or a shard is gone; nothing committed.
    """
    why = lease.lost()
    if why is None:
        present = set(list_names(target))
        missing = [f.path for f in manifest.files if f.path not in present]
        if missing:
            why = (f"{len(missing)} of the shards this writer wrote are gone, such as "
                   f"{missing[0]} (removed while it ran)")
    if why is not None:
        raise CommitConflictError(
            f"{target.uri}: {why}; nothing was committed. Run the job again.")
    commit_version(target, manifest)


def commit_version(target: ResolvedPath, manifest: Manifest) -> None:
    """Creates ``manifest`` as version ``manifest.version`` of ``target``, put-if-absent.

    A create answered "exists" is read back: if it holds this writer's id,
    an earlier attempt whose response was lost won, and this is a success.

    Raises:
        CommitConflictError: another writer created that version.
    """
    loc = target.join(version_name(manifest.version))
    data = manifest.to_json().encode("utf-8")
    try:
        put_if_absent(loc, data)
        return
    except FileExistsError:
        pass
    import json

    try:
        winner = json.loads(loc.fs.cat_file(loc.path)).get("writer")
    except (ValueError, AttributeError, FileNotFoundError):
        winner = None
    if winner == manifest.writer:
        return
    raise CommitConflictError(
        f"{target.uri}: another writer ({str(winner)[:64]}) committed version "
        f"{manifest.version} while this one ({manifest.writer}) was writing; this run "
        "committed nothing and removed its own shards. Read the dataset to use the other "
        "run's result, or run again with --overwrite to replace it.",
        version=manifest.version,
    )


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
    row_group_bytes: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    before_commit: Callable[[Manifest], None] | None = None,
    inputs: Sequence[InputFile] | None = None,
    writer_id: str | None = None,
    report: str | None = None,
    quarantine: str | None = None,
    watch: Any = None,
    **fs_kwargs: Any,
) -> Manifest:
    """Writes ``ds`` as a new committed version at ``uri`` and returns its manifest.

    Shards are written first, the manifest version last, put-if-absent; see
    the module docstring and docs/architecture.md, "Commit protocol". The
    previous version and its files stay readable (``read_dataset(uri,
    version=N)``) until ``slicefeed vacuum`` removes them.

    Args:
        ds: The dataset to write (executed by this call).
        uri: The dataset prefix (``gs://bucket/out``, a local folder).
        fingerprint: Fingerprint of the producing pipeline, stored in the manifest.
        metadata: Extra JSON-serialisable manifest metadata (fit statistics...).
        overwrite: Commit a new version over a dataset already committed at
            ``uri``. The current version stays current until this one commits;
            an unparseable current manifest is moved to ``_corrupt/`` after it.
        compression: Parquet codec for the shards.
        min_rows_per_file: Minimum rows per shard (Ray buffers rows to reach it).
        row_group_size: Maximum rows per Parquet row group.
        row_group_bytes: Maximum decoded (Arrow) bytes per row group (default
            64 MiB): what a reader holds and decodes at once. The manifest
            records every shard's row-group row counts.
        ray_remote_args: Ray options for the write tasks.
        before_commit: Called with the manifest just before it is committed;
            raising aborts the commit (this writer's shards are removed).
        inputs: The input listing ``fingerprint`` was computed from (stored).
        writer_id: This writer's id (default: a fresh one); in shard names.
        report: Path (relative to ``uri``) of the run report this writer will
            write, recorded in the manifest.
        quarantine: Folder (relative to ``uri``) of this writer's quarantined records.
        watch: Told before and after each shard is written (``begin(key, what)``,
            ``end(key)``; see ``connectors._watch``), so that a worker that dies
            writing can be reported by its shard.
        **fs_kwargs: Passed to :func:`resolve_filesystem`.

    Raises:
        AlreadyCommittedError: ``uri`` holds a committed dataset and ``overwrite`` is False.
        CommitConflictError: another writer committed first (nothing committed here).
        CorruptManifestError: the current manifest does not parse and ``overwrite`` is False.
    """
    target = resolve_filesystem(uri, **fs_kwargs)
    versions = list_versions(target)
    parent = max(versions) if versions else None
    corrupt_parent: ResolvedPath | None = None
    if parent is not None:
        if not overwrite:
            existing = read_manifest(target)  # CorruptManifestError names the file
            raise AlreadyCommittedError(
                f"{target.uri} already holds a committed dataset ({existing.num_rows} rows, "
                f"fingerprint {existing.fingerprint}). Pass overwrite=True (CLI: --overwrite) "
                "to replace it, or write to another prefix."
            )
        try:
            read_manifest(target, version=parent)
        except CorruptManifestError:
            corrupt_parent = versions[parent]
    writer_id = writer_id or new_writer_id()
    lease = Lease(target, writer_id).start()
    sink = CommittedParquetDatasink(
        target,
        run_id=writer_id,
        fingerprint=fingerprint,
        metadata=metadata,
        compression=compression,
        min_rows_per_file=min_rows_per_file,
        row_group_size=row_group_size,
        row_group_bytes=row_group_bytes,
        watch=watch,
    )
    sidecars = [s for s in (report, quarantine) if s]
    committed = False
    try:
        ds.write_datasink(sink, ray_remote_args=ray_remote_args)
        if sink.manifest is None:  # Ray skipped on_write_complete: no blocks at all
            sink.on_write_complete(WriteResult(num_rows=0, size_bytes=0, write_returns=[]))
        assert sink.manifest is not None
        manifest = dataclasses.replace(
            sink.manifest, version=(parent or 0) + 1, parent=parent,
            inputs=None if inputs is None else tuple(inputs), report=report,
            quarantine=quarantine, created_at=now_iso(),
        )
        if before_commit is not None:
            before_commit(manifest)
        commit_held(target, lease, manifest)
        committed = True
    finally:
        if not committed:
            try:
                remove_own(target, writer_id, _own_shards(target, writer_id), sidecars)
            finally:
                lease.release()
    try:
        if corrupt_parent is not None:
            aside = set_aside(target, corrupt_parent)
            logger.warning("%s could not be parsed; kept at %s", corrupt_parent.uri, aside)
        cleanup(target, keep_writers=[writer_id])
    finally:
        lease.release()
    return manifest


def _own_shards(target: ResolvedPath, writer_id: str) -> list[str]:
    from slicefeed.connectors._commit import shard_writer

    return [n for n in list_names(target) if shard_writer(n) == writer_id]


def read_dataset(
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    provenance: bool = False,
    version: int | None = None,
    verify: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads the committed dataset at ``uri``, through its manifest only.

    Files in the prefix that the manifest does not list (a crashed run's
    shards) are never read.

    Args:
        uri: The dataset prefix.
        columns: Columns to read (projection).
        provenance: Add ``_sf_file`` (shard name) and ``_sf_row`` columns.
        version: The manifest version to read (default: the current one); an
            older version is readable until ``slicefeed vacuum`` removes it.
        verify: Also check every shard's SHA-256 against the manifest (reads
            every byte). Sizes (from one listing) and row counts (from the
            footers) are always checked.
        shard: ``(index, count)``: read only the manifest's files ``index::count``.
        watch: With ``provenance``: told before and after each shard is read
            (see ``connectors._watch``), so that a worker that dies reading a
            shard can be reported by that shard.
        **kwargs: ``credentials``/``anonymous``/``project``/``storage_options`` go to
            :func:`resolve_filesystem`; the rest to ``ray.data.read_parquet``.

    Raises:
        NotCommittedError: ``uri`` has no manifest (or not ``version``).
        CorruptManifestError: The manifest does not validate.
        FileNotFoundError: A file the manifest lists is missing.
        ShardMismatchError: A shard's size, row count or (``verify``) SHA-256
            differs from the manifest; names the first such shard.
        CorruptFileError: A shard's Parquet footer does not parse; names it.
    """
    from slicefeed.connectors._readers import ParquetFilesDatasource, _split_kwargs, shard_files

    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    target = resolve_filesystem(uri, **fs_kwargs)
    manifest = read_manifest(target, version=version)
    if columns is not None:
        missing = [c for c in columns if c not in manifest.schema.names]
        if missing:
            raise MissingColumnError(
                f"{target.uri}: column(s) {missing} not in the dataset; available: "
                f"{', '.join(manifest.schema.names)}."
            )
    if not manifest.files:
        return ray.data.from_arrow(manifest.schema.empty_table())
    files = shard_files(list(manifest.files), shard, uri=target.uri)
    verify_shards(target, dataclasses.replace(manifest, files=tuple(files)), checksums=verify)
    paths = [target.join(f.path).path for f in files]
    if provenance:
        return ray.data.read_datasource(
            ParquetFilesDatasource(paths, source=target, columns=columns, provenance=True,
                                   watch=watch),
            **ray_kwargs,
        )
    try:
        return ray.data.read_parquet(
            paths, filesystem=target.fs, columns=list(columns) if columns else None, **ray_kwargs
        )
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{target.uri}: a file listed in its manifest is missing ({e}). The dataset "
            "was modified after it was committed; rewrite it with overwrite."
        ) from None
