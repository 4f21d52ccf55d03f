"""Runs that write one shard per input file, so a crash rerun reuses finished work.

Ray Data does not tie output blocks to input files, so a rerun could not
tell which input a crashed run had finished. Here the unit is explicit: one
input file is read, transformed and written by one Ray task (packing and
every other per-batch transform see that file's rows only), which

1. writes its shard ``part-<unit>-<writer>.parquet`` (``<unit>``: the file's
   position in the sorted input listing; the writer id as in the commit
   protocol), then
2. creates, put-if-absent, the unit's side record
   ``_units/<unit>-<key>.json`` naming the shard, its size, SHA-256, rows,
   schema and the unit's stage counters. ``<key>`` digests the pipeline
   fingerprint and the input file's path, size and generation, so a record
   is only ever found by a run of the same pipeline over the same file.

A rerun (:func:`write_units`) reads the records of its units, adopts the
shards of writers whose lease is dead (``Lease.adopt`` before relying on
them), verifies each (size + SHA-256; a mismatch or a missing shard means
the unit is recomputed), and runs tasks only for the units still missing.
The manifest lists the shards in unit order, reused ones with their original
writer, so it equals a clean run's (same rows, same checksums). A failed run
removes its own records, then its own shards (files carrying its id only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from slicefeed.connectors._commit import (
    SHARD_PREFIX,
    Lease,
    cleanup,
    live_writers,
    put_if_absent,
    remove_own,
    shard_writer,
    write_atomic,
)
from slicefeed.connectors._errors import AlreadyCommittedError, task_error_cause
from slicefeed.connectors._fs import ResolvedPath
from slicefeed.connectors._manifest import (
    InputFile,
    Manifest,
    ManifestFile,
    list_names,
    list_versions,
    now_iso,
    read_manifest,
)
from slicefeed.connectors._parquet import encode_shard
from slicefeed.connectors._verify import shard_sha256
from slicefeed.connectors._watch import watching

logger = logging.getLogger(__name__)

UNITS_DIR = "_units"

__all__ = ["UNITS_DIR", "FileReader", "Unit", "UnitResult", "unit_key", "write_units"]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One input file of a run: its position in the listing, its path and identity."""

    index: int
    path: str  # filesystem path, as the reader opens it
    input: InputFile
    key: str  # digest of the fingerprint and the file's uri, size and generation

    @property
    def record(self) -> str:
        return f"{UNITS_DIR}/{self.index:05d}-{self.key}.json"

    def shard(self, writer: str) -> str:
        return f"{SHARD_PREFIX}{self.index:05d}-{writer}.parquet"


def unit_key(fingerprint: str, f: InputFile) -> str:
    h = hashlib.sha256(json.dumps([fingerprint, f.uri, f.size, f.generation]).encode())
    return h.hexdigest()[:24]


@dataclasses.dataclass
class UnitResult:
    """What :func:`write_units` committed and how much it reused."""

    manifest: Manifest
    units: int
    reused: int
    bytes_read: int  # input bytes of the units computed by this run
    counts: list[dict[str, Any]]  # the stage counters of the reused units


def _run_unit(target: ResolvedPath, unit: Unit, writer: str, read: Callable[[str], pa.Table],
              process: Callable[[pa.Table], tuple[pa.Table, dict[str, Any]]],
              compression: str, row_group_size: int | None,
              row_group_bytes: int | None = None, watch: Any = None) -> dict[str, Any]:
    """Ray task body: read one file, transform it, write its shard and side record."""
    table, counts = process(read(unit.path))
    entry: dict[str, Any] = {"index": unit.index, "key": unit.key, "writer": writer,
                             "counts": counts, "path": None, "num_rows": 0,
                             "input": unit.input.uri}
    if table.num_rows:
        with watching(watch, f"write:{unit.shard(writer)}",
                      f"writing the shard of input file {unit.input.uri!r} to {target.uri}"):
            data, groups = encode_shard(table, compression=compression,
                                        row_group_size=row_group_size,
                                        row_group_bytes=row_group_bytes)
            name = unit.shard(writer)
            write_atomic(target.join(name), data)
        entry.update(
            path=name, num_rows=table.num_rows, num_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            row_groups=groups,
            schema=_b64(table.schema.remove_metadata().serialize().to_pybytes()),
        )
    doc = json.dumps(entry).encode()
    try:
        put_if_absent(target.join(unit.record), doc)
    except FileExistsError:
        # Another writer finished this unit first (or the response to our own
        # create was lost). This run still lists its own shard: a live writer
        # removes its shards when it loses or fails, so they are never borrowed
        # from inside a task; only a dead writer's shards are adopted (_reusable).
        pass
    return entry


class FileReader:
    """Reads one input file of a source into a table with provenance (picklable).

    Uses the same datasource as the source's Ray Data reader, so rows,
    provenance and bad-record marking are those of a Ray Data read.
    """

    def __init__(self, fmt: str, source: ResolvedPath, *, columns: Sequence[str] | None,
                 mark_errors: bool, options: Mapping[str, Any], watch: Any = None):
        self.fmt = fmt
        self.watch = watch  # told which file is being read (connectors._watch)
        self.source = source
        self.columns = list(columns) if columns is not None else None
        self.mark_errors = mark_errors
        self.options = dict(options)

    def __call__(self, path: str) -> pa.Table:
        from slicefeed.connectors import _readers
        from slicefeed.connectors._formats import get_format

        cls = getattr(_readers, get_format(self.fmt).datasource)
        ds = cls([path], source=self.source, columns=self.columns, provenance=True,
                 mark_errors=self.mark_errors, watch=self.watch, **self.options)
        tables = [pa.Table.from_pandas(b) if not isinstance(b, pa.Table) else b
                  for task in ds.get_read_tasks(1) for b in task()]
        tables = [t for t in tables if t.num_rows] or tables[:1]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


def _b64(b: bytes) -> str:
    import base64

    return base64.b64encode(b).decode()


def _read_record(target: ResolvedPath, unit: Unit) -> dict[str, Any] | None:
    loc = target.join(unit.record)
    try:
        doc = json.loads(loc.fs.cat_file(loc.path))
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != unit.key or doc.get("index") != unit.index:
        return None
    return doc


def _verify(target: ResolvedPath, rec: Mapping[str, Any]) -> bool:
    """A record's shard exists with the recorded size and SHA-256 (no shard: nothing to check)."""
    name = rec.get("path")
    if name is None:
        return rec.get("num_rows") == 0
    if not isinstance(name, str) or shard_writer(name) != rec.get("writer"):
        return False
    loc = target.join(name)
    try:
        if loc.fs.size(loc.path) != rec.get("num_bytes"):
            return False
        return shard_sha256(target, name) == rec.get("sha256")
    except FileNotFoundError:
        return False


def _reusable(target: ResolvedPath, units: Sequence[Unit], lease: Lease) -> dict[int, dict[str, Any]]:
    """Verified records of finished units whose writer is gone, adopted by ``lease``."""
    found = {u.index: r for u in units if (r := _read_record(target, u)) is not None}
    if not found:
        return {}
    live, _ = live_writers(target)
    # A live writer may still remove its shards (if it fails): recompute those units.
    found = {i: r for i, r in found.items() if r.get("writer") not in live - {lease.writer_id}}
    # Claim before verifying, so another writer's cleanup leaves them alone.
    lease.adopt(r["path"] for r in found.values() if r.get("path"))
    return {i: r for i, r in found.items() if _verify(target, r)}


def write_units(
    target: ResolvedPath,
    units: Sequence[Unit],
    *,
    read: Callable[[str], pa.Table],
    process: Callable[[pa.Table], tuple[pa.Table, dict[str, Any]]],
    writer_id: str,
    overwrite: bool,
    fingerprint: str,
    metadata: Mapping[str, Any],
    inputs: Sequence[InputFile],
    report: str | None,
    quarantine: str | None,
    before_commit: Callable[[Manifest, list[dict[str, Any]]], None] | None = None,
    compression: str = "snappy",
    row_group_size: int | None = None,
    row_group_bytes: int | None = None,
    on_reused: Callable[[list[dict[str, Any]]], None] | None = None,
    max_retries: int = 2,
    watch: Any = None,
) -> UnitResult:
    """Computes the units not finished by an earlier run and commits a new version.

    Follows the commit protocol of :func:`write_parquet` (parent version,
    lease, put-if-absent version, cleanup); see the module docstring for the
    units. ``read(path)`` returns one input file as a table (with
    provenance); ``process(table)`` returns the output rows and the unit's
    stage counters. Both run in Ray tasks (one per missing unit).
    ``before_commit(manifest, counts)`` gets every unit's counters.
    ``max_retries``: reruns of a unit task whose worker died; ``watch`` is told
    which shard a task writes (see ``connectors._watch``; ``read`` reports
    the file it reads itself).

    Raises:
        AlreadyCommittedError, CommitConflictError: as :func:`write_parquet`.
    """
    import ray

    from slicefeed.connectors._writers import _common_schema, _own_shards, commit_held

    versions = list_versions(target)
    parent = max(versions) if versions else None
    if parent is not None and not overwrite:
        existing = read_manifest(target)
        raise AlreadyCommittedError(
            f"{target.uri} already holds a committed dataset ({existing.num_rows} rows, "
            f"fingerprint {existing.fingerprint}). Pass overwrite=True (CLI: --overwrite) "
            "to replace it, or write to another prefix."
        )
    target.fs.makedirs(target.path, exist_ok=True)
    lease = Lease(target, writer_id).start()
    sidecars = [s for s in (report, quarantine) if s]
    committed = False
    try:
        reused = _reusable(target, units, lease)
        # Quarantined rows live under the crashed writer's folder, which
        # cleanup removes: such units are recomputed.
        reused = {i: r for i, r in reused.items()
                  if not (r.get("counts") or {}).get("rows_quarantined")}
        if parent is not None:
            # Overwriting recomputes what is committed: an input edited in place
            # with its size and mtime kept has the same record key, and reusing
            # the committed run's shards would commit the old rows again. Shards
            # of runs that never committed (a crashed overwrite) are still reused.
            committed_files = read_manifest(target).files
            listed = {f.path for f in committed_files}
            writers = {f.writer for f in committed_files}
            reused = {i: r for i, r in reused.items()
                      if r.get("path") and r["path"] not in listed
                      and r.get("writer") not in writers}
        if on_reused is not None:
            on_reused([r.get("counts") or {} for r in reused.values()])
        todo = [u for u in units if u.index not in reused]
        # Bounded like the Ray Data path: a unit that kills its worker every time
        # ends the run instead of being resubmitted forever.
        task = ray.remote(num_cpus=1, max_retries=max_retries)(_run_unit)
        refs = [task.remote(target, u, writer_id, read, process, compression, row_group_size,
                            row_group_bytes, watch)
                for u in todo]
        results: dict[int, dict[str, Any]] = dict(reused)
        # Every task ends before anything is judged, so a failed run's cleanup
        # below sees all the records and shards its tasks wrote.
        if refs:
            ray.wait(refs, num_returns=len(refs), fetch_local=False)
        try:
            for u, rec in zip(todo, ray.get(refs)):
                results[u.index] = rec
        except ray.exceptions.RayTaskError as e:
            raise (task_error_cause(e) or e) from None
        ordered = [results[u.index] for u in units]
        with_rows = [r for r in ordered if r.get("path")]
        schema = _common_schema(
            [{**r, "schema": _unb64(r["schema"])} for r in with_rows], target.uri)
        files = tuple(
            ManifestFile(r["path"], int(r["num_rows"]), int(r["num_bytes"]), r["sha256"],
                         tuple(r["row_groups"]), r["writer"])
            for r in with_rows
        )
        manifest = Manifest(
            files=files, schema=schema if schema is not None else pa.schema([]),
            fingerprint=fingerprint, metadata={**metadata, "run_id": writer_id},
            writer=writer_id, version=(parent or 0) + 1, parent=parent,
            inputs=tuple(inputs), report=report, quarantine=quarantine, created_at=now_iso(),
        )
        if before_commit is not None:
            before_commit(manifest, [r.get("counts") or {} for r in ordered])
        commit_held(target, lease, manifest)
        committed = True
    finally:
        if not committed:
            try:
                # This writer's records first (their shards are about to go).
                for u in units:
                    rec = _read_record(target, u)
                    if rec is not None and rec.get("writer") == writer_id:
                        loc = target.join(u.record)
                        try:
                            loc.fs.rm(loc.path)
                        except FileNotFoundError:
                            pass
                remove_own(target, writer_id, _own_shards(target, writer_id), sidecars)
            finally:
                lease.release()
    try:
        cleanup(target, keep_writers=[writer_id])
    finally:
        lease.release()
    return UnitResult(
        manifest=manifest, units=len(units), reused=len(reused),
        bytes_read=sum(int(u.input.size or 0) for u in todo),
        counts=[r.get("counts") or {} for r in reused.values()],
    )


def _unb64(s: str) -> bytes:
    import base64

    return base64.b64decode(s)


def stale_records(target: ResolvedPath) -> list[str]:
    """Names of the side records in ``target`` (for inspection and tests)."""
    return list_names(target.join(UNITS_DIR))
