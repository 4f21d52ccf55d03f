"""`Pipeline`: a validated spec turned into a lazy Ray Dataset, and batch runs.

``dataset()`` reads the source(s) with provenance (row identity for seeded
transforms and error messages), applies the transforms with
``map_batches(batch_format="pyarrow")`` (consecutive row-level transforms fused
into one stage; dataset-level ones such as ``deduplicate`` through their
``dataset_op``; transforms that need statistics are fitted first with Ray
aggregations), applies the bad-record policy after every transform, and drops
the provenance columns. ``run()`` writes the result as a committed dataset and
returns a :class:`RunReport`, also written as ``_report.json`` beside the
manifest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import metadata as _md
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from slicefeed import connectors
from slicefeed.connectors import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    QUARANTINE_DIR,
    RAW_COLUMN,
    REPORT_NAME,
    REPORTS_DIR,
    AlreadyCommittedError,
    BadRecordError,
    CommitConflictError,
    InputFile,
    Manifest,
    MissingColumnError,
    SpecError,
    WorkerCrashError,
    check_sink_outside_sources,
    is_committed,
    list_inputs,
    new_writer_id,
    read_manifest,
    resolve_filesystem,
    write_atomic,
)
from slicefeed.connectors._compat import task_retry_args, task_retry_options
from slicefeed.connectors._errors import printable, typed_columns
from slicefeed.connectors._formats import FORMATS, get_format
from slicefeed.pipelines import _rerun
from slicefeed.pipelines._spec import (
    PipelineSpec,
    SourceSpec,
    expand_uri_templates,
    listed_fingerprint,
    load_spec,
    validate_spec,
)
from slicefeed.transforms import DatasetTasks

if TYPE_CHECKING:  # pragma: no cover
    import ray


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("slicefeed", "ray", "jax", "pyarrow"):
        try:
            out[pkg] = _md.version(pkg)
        except _md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


@dataclasses.dataclass
class TransformCounts:
    """What one transform of a run did, summed over its batches.

    Attributes:
        index: Position in the spec's ``transforms`` list.
        name: The transform's YAML name.
        reshapes_rows: Whether output rows are not input rows (packing).
        rows_in / rows_out / rows_bad: Rows in, good rows out, rows marked bad.
        time_s: Time spent in the transform, summed over tasks (not wall time).
        slots / tokens: For packed output (``segment_ids``): all slots and
            non-padding slots.
    """

    index: int
    name: str
    reshapes_rows: bool = False
    rows_in: int = 0
    rows_out: int = 0
    rows_bad: int = 0
    time_s: float = 0.0
    slots: int = 0
    tokens: int = 0
    #: A dataset-level op (``deduplicate``): counted by the batch stages next to it.
    dataset_op: bool = False

    @property
    def rows_filtered(self) -> int:
        """Rows the transform removed (0 for a reshaping transform)."""
        return 0 if self.reshapes_rows else self.rows_in - self.rows_out - self.rows_bad

    def add(self, other: TransformCounts) -> None:
        for f in ("rows_in", "rows_out", "rows_bad", "time_s", "slots", "tokens"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.dataset_op = self.dataset_op or other.dataset_op

    def to_report(self) -> dict[str, Any]:
        """The report's per-transform entry."""
        out: dict[str, Any] = {"index": self.index, "name": self.name, "rows_in": self.rows_in,
                               "rows_out": self.rows_out, "rows_bad": self.rows_bad,
                               "time_s": round(float(self.time_s), 3)}
        if self.slots:
            out["packing_efficiency"] = round(self.tokens / self.slots, 4)
            out["tokens"], out["slots"] = int(self.tokens), int(self.slots)
        return out


@dataclasses.dataclass
class StageCounts:
    """Row counts of a run's stages: one batch's report, or the run's total.

    Attributes:
        rows_read: Rows (and undecodable records) that came from the reader.
        rows_skipped / rows_quarantined: Bad rows dropped under ``on_error:
            skip`` / written aside under ``on_error: quarantine``.
        rows_out / bytes_out: Rows and in-memory Arrow bytes handed to the writer.
        transforms: Per transform, by its position in the spec.
    """

    rows_read: int = 0
    rows_skipped: int = 0
    rows_quarantined: int = 0
    rows_out: int = 0
    bytes_out: int = 0
    transforms: dict[int, TransformCounts] = dataclasses.field(default_factory=dict)
    #: Input files that could not be read at all (row count unknown).
    unreadable: set[str] = dataclasses.field(default_factory=set)

    def __bool__(self) -> bool:
        return any((self.rows_read, self.rows_skipped, self.rows_quarantined, self.rows_out,
                    self.bytes_out, self.transforms, self.unreadable))

    @property
    def rows_bad(self) -> int:
        return self.rows_skipped + self.rows_quarantined

    def transform(self, index: int, t: Any) -> TransformCounts:
        """The counts of transform ``t`` at ``index`` (created on first use)."""
        if index not in self.transforms:
            self.transforms[index] = TransformCounts(index, t.name, bool(t.reshapes_rows))
        return self.transforms[index]

    def add(self, other: StageCounts) -> None:
        """Adds ``other``'s counts to these."""
        for f in ("rows_read", "rows_skipped", "rows_quarantined", "rows_out", "bytes_out"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.unreadable |= other.unreadable
        for i, tc in other.transforms.items():
            if i in self.transforms:
                self.transforms[i].add(tc)
            else:
                self.transforms[i] = dataclasses.replace(tc)

    def filtered_by(self) -> dict[str, int]:
        """Rows removed per transform name (transforms that removed any), dataset-level
        ops (``deduplicate``) included."""
        out: dict[str, int] = {}
        for tc in self.transforms.values():
            if tc.rows_filtered:
                out[tc.name] = out.get(tc.name, 0) + tc.rows_filtered
        return out

    def reshaped(self) -> dict[str, dict[str, int]]:
        """``{name: {"rows_in": n, "rows_out": m}}`` of the row-reshaping transforms."""
        out: dict[str, dict[str, int]] = {}
        for tc in self.transforms.values():
            if tc.reshapes_rows:
                r = out.setdefault(tc.name, {"rows_in": 0, "rows_out": 0})
                r["rows_in"] += tc.rows_in - tc.rows_bad
                r["rows_out"] += tc.rows_out
        return out

    def transform_rows(self) -> list[dict[str, Any]]:
        """Per transform that ran in a batch stage, in spec order: rows in/out, bad
        rows, task time, packing efficiency (dataset-level ops are in ``filtered_by``)."""
        return [self.transforms[i].to_report() for i in sorted(self.transforms)
                if not self.transforms[i].dataset_op]


class _Counters:
    """Row counts reported by the transform stages of one run (a Ray actor, made
    by :func:`_counters_actor`; Ray is imported only when a run starts).

    Each report carries a key naming the batch (stage + the provenance of its
    rows); a key seen before is ignored, so a batch that Ray re-executes after
    a worker died is not counted twice.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forgets everything: the state of a new actor, for the next run."""
        self.counts = StageCounts()
        self.seen: set[str] = set()
        # Work started (a stage's batch, a file read, a shard written):
        # key -> [attempts, what it is, order of the latest start].
        self.started: dict[str, list[Any]] = {}
        self.starts = 0

    def begin(self, key: str, what: str) -> None:
        self.starts += 1
        entry = self.started.setdefault(key, [0, what, 0])
        entry[0] += 1
        entry[1] = what
        entry[2] = self.starts

    def describe(self, key: str, what: str) -> None:
        """Replaces what a started batch holds (no new attempt)."""
        if key in self.started:
            self.started[key][1] = what

    def finish(self, key: str) -> None:
        """Marks work started by :meth:`begin` as done (reading, writing)."""
        self.seen.add(key)

    def crashed(self) -> list[tuple[int, str]]:
        """(attempts, what) of work started but never finished, most attempts first,
        then the latest started first (work inside other work: a read inside a write
        task is the one that was running)."""
        out = [(n, order, what) for k, (n, what, order) in self.started.items()
               if k not in self.seen]
        return [(n, what) for n, _, what in sorted(out, reverse=True)]

    def add(self, delta: StageCounts, key: str | None = None) -> None:
        if key is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        self.counts.add(delta)

    def get(self) -> StageCounts:
        return self.counts


# Counters actors of runs that committed, kept for this driver's next runs:
# starting an actor is a new worker process, which the first task of a run
# would otherwise wait for (about a second on a busy 2-core machine). Only
# actors of runs whose tasks have all ended are kept, and each is reset before
# it serves again, so no count crosses from one run to another.
_IDLE_COUNTERS: list[tuple[str, Any]] = []  # (the driver's Ray worker id, actor)
_IDLE_LOCK = threading.Lock()
_MAX_IDLE_COUNTERS = 2


def _counters_actor() -> Any:
    """A :class:`_Counters` actor for one run, reset (no CPU: it only counts);
    an idle one of an earlier run of this driver when there is one."""
    import ray

    owner = ray.get_runtime_context().get_worker_id()
    while True:
        with _IDLE_LOCK:
            # Another driver id is an earlier ray.init, whose handles are gone.
            _IDLE_COUNTERS[:] = [(o, a) for o, a in _IDLE_COUNTERS if o == owner]
            actor = _IDLE_COUNTERS.pop()[1] if _IDLE_COUNTERS else None
        if actor is None:
            return ray.remote(num_cpus=0)(_Counters).remote()
        try:
            ray.get(actor.reset.remote(), timeout=30)
            return actor
        except Exception:  # noqa: BLE001 - a dead or stuck actor: start a new one
            ray.kill(actor)


def _release_counters(actor: Any, *, reuse: bool) -> None:
    """Ends a run's use of its counters: kept for a later run when ``reuse`` (every
    task of the run has ended), killed otherwise."""
    import ray

    if reuse:
        owner = ray.get_runtime_context().get_worker_id()
        with _IDLE_LOCK:
            if len(_IDLE_COUNTERS) < _MAX_IDLE_COUNTERS:
                _IDLE_COUNTERS.append((owner, actor))
                return
    ray.kill(actor)


def _batch_key(stage: str, table: pa.Table) -> str | None:
    """Identity of a batch: its stage and the provenance of its rows (vectorised)."""
    import hashlib

    if PROVENANCE_ROW not in table.column_names or PROVENANCE_FILE not in table.column_names:
        return None
    h = hashlib.sha1(stage.encode())
    files = table.column(PROVENANCE_FILE).combine_chunks()
    rows = table.column(PROVENANCE_ROW).combine_chunks()
    h.update(rows.fill_null(-1).to_numpy(zero_copy_only=False).tobytes())
    enc = files.dictionary_encode()
    h.update(enc.indices.to_numpy(zero_copy_only=False).tobytes())
    h.update("\0".join(enc.dictionary.to_pylist()).encode())
    return h.hexdigest()


def _describe_batch(table: pa.Table, transforms: Sequence[Any]) -> str:
    """``running transform(s) a, b on file(s) x (rows i..j)`` for a batch (vectorised)."""
    return _describe_rows(f"transform(s) {', '.join(t.name for t in transforms)}", table)


def _type_mismatch(transform: Any, table: pa.Table, error: Exception) -> SpecError:
    """A transform that met column types its checks did not: every file of a
    source is typed from its own values (CSV, JSONL), so a later file can give
    a column another type than the one ``validate`` checked against."""
    where = ""
    if PROVENANCE_FILE in table.column_names:
        files = table.column(PROVENANCE_FILE).unique().to_pylist()[:3]
        where = f" from input file(s) {', '.join(repr(printable(str(f), 200)) for f in files)}"
    own = {PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN, RAW_COLUMN}
    data = [f for f in table.schema if f.name not in own]
    types = typed_columns(data)
    first = printable(str(error).splitlines()[0] if str(error) else type(error).__name__, 300)
    return SpecError(
        f"transform {transform.name!r} cannot run on a batch{where} whose columns are "
        f"{types} ({first}). A column of this file has "
        "another type than in the files checked before the run; add a `cast` transform "
        "before it so every file gives the same types.")


def _describe_rows(what: str, table: pa.Table) -> str:
    """``running <what> on input file(s) x (rows i..j)`` (vectorised)."""
    files = table.column(PROVENANCE_FILE).unique().to_pylist()[:3]
    rows = table.column(PROVENANCE_ROW)
    lo, hi = pc.min(rows).as_py(), pc.max(rows).as_py()
    return (f"running {what} on input file(s) {', '.join(repr(f) for f in files)}"
            + (f" (rows {lo}..{hi})" if lo is not None else ""))


class _Watch:
    """Tells the run's counters which file a task reads or which shard it writes
    (``begin``/``end``, see ``connectors._watch``), so that a worker that dies
    there is reported by that file or shard."""

    def __init__(self, counters: Any):
        self.counters = counters

    def begin(self, key: str, what: str) -> None:
        import ray

        ray.get(self.counters.begin.remote(key, what))

    def end(self, key: str) -> None:
        import ray

        ray.get(self.counters.finish.remote(key))


class _Watched:
    """A dataset-level transform's batch function, recorded per batch like a stage."""

    def __init__(self, fn: Any, what: str, counters: Any):
        self.fn, self.what, self.counters = fn, what, counters
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)  # Ray names the stage by it

    def __call__(self, table: pa.Table) -> Any:
        import ray

        key = _batch_key(self.what, table)
        if key is None:
            return self.fn(table)
        ray.get(self.counters.begin.remote(key, _describe_rows(self.what, table)))
        out = self.fn(table)
        ray.get(self.counters.finish.remote(key))
        return out


class _WatchedGroups:
    """A dataset-level transform's per-group function, recorded per task.

    One record per group would cost a round trip per key; instead each task
    attempt records the input files of the groups it has reached (up to
    ``_MAX_FILES`` names), so a worker that dies names the stage and, for a
    small number of files, the file. A process moving on to the next task
    marks the previous one finished.
    """

    _MAX_FILES = 8

    def __init__(self, fn: Any, what: str, counters: Any):
        self.fn, self.what, self.counters = fn, what, counters
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)  # Ray names the stage by it
        self.task: str | None = None
        self.files: list[str] = []

    def __call__(self, group: pa.Table) -> Any:
        import ray

        if PROVENANCE_FILE in group.column_names:
            task = ray.get_runtime_context().get_task_id() or ""
            if task != self.task:
                if self.task is not None:
                    ray.get(self.counters.finish.remote(f"{self.what}:{self.task}"))
                self.task, self.files = task, []
                new = True
            else:
                new = False
            if len(self.files) < self._MAX_FILES:
                seen = group.column(PROVENANCE_FILE).unique().to_pylist()
                more = [f for f in seen if f not in self.files][: self._MAX_FILES - len(self.files)]
                if more or new:
                    self.files += more
                    what = (f"running {self.what} on key groups of input file(s) "
                            f"{', '.join(repr(f) for f in self.files)}"
                            + (" and others" if len(self.files) >= self._MAX_FILES else ""))
                    call = self.counters.begin if new else self.counters.describe
                    ray.get(call.remote(f"{self.what}:{task}", what))
        return self.fn(group)


class _PipelineTasks(DatasetTasks):
    """A run's policy for dataset-level transforms: bounded reruns, watched functions."""

    def __init__(self, retries: int, counters: Any):
        self.options = task_retry_options(retries)
        self.counters = counters

    def map_batches(self, ds: ray.data.Dataset, fn: Any, *, what: str,
                    **kwargs: Any) -> ray.data.Dataset:
        if self.counters is not None:
            fn = _Watched(fn, what, self.counters)
        with task_retry_args():
            return ds.map_batches(fn, **kwargs, **self.options)

    def map_groups(self, grouped: Any, fn: Any, *, what: str, **kwargs: Any) -> ray.data.Dataset:
        if self.counters is not None:
            fn = _WatchedGroups(fn, what, self.counters)
        with task_retry_args():
            return grouped.map_groups(fn, **kwargs, **self.options)


class _Stage:
    """One fused ``map_batches`` stage: transforms in order + bad-record policy.

    Picklable; ships to Ray workers. Bad rows (marked by a transform in
    ``_sf_error``) are removed right after the transform that marked them:
    ``fail`` raises :class:`BadRecordError` naming file and row; ``skip``
    counts them; ``quarantine`` also writes them, with their provenance and
    reason, under ``<sink>/_quarantine/``. The first stage
    (``count_input``) does the same for records the reader could not decode
    (``on_error: skip|quarantine`` reads with ``mark_errors=True``).
    """

    def __init__(
        self,
        transforms: Sequence[Any],
        *,
        on_error: str,
        counters: Any = None,
        quarantine: Any = None,
        count_input: bool = False,
        stage_id: str = "",
        first_index: int = 0,
        op_before: tuple[int, Any] | None = None,
        op_after: tuple[int, Any] | None = None,
    ):
        from slicefeed.transforms import chain_steps

        self.transforms = list(transforms)
        #: How the transforms run (fused where exact), planned once per stage.
        self.steps = chain_steps(self.transforms)
        #: Position of ``transforms[0]`` in the spec's list (names the counters).
        self.first_index = first_index
        self.on_error = on_error
        self.counters = counters
        self.quarantine = quarantine  # ResolvedPath of <sink>/_quarantine or None
        self.count_input = count_input
        self.stage_id = stage_id or ("read" if count_input else "+".join(t.name for t in self.transforms))
        #: ``(index, transform)`` of the dataset-level op (``deduplicate``) right
        #: before this stage, whose output rows are this stage's input, and of the
        #: one right after it, whose input rows are this stage's output: counted
        #: here as that op's ``rows_out`` / ``rows_in``, in the report this stage
        #: sends anyway, so an op needs no counting stage (and no actor call per
        #: batch) of its own.
        self.op_before, self.op_after = op_before, op_after
        #: A unit task's own tally of the counters (kept in its side record).
        self.local: StageCounts | None = None

    def _handle_bad(self, bad: pa.Table, what: Any, delta: StageCounts) -> None:
        from slicefeed.transforms import bad_record_error

        if self.on_error == "fail":
            raise bad_record_error(bad, what)
        if self.on_error == "quarantine":
            delta.rows_quarantined += bad.num_rows
        else:
            delta.rows_skipped += bad.num_rows
        if self.on_error == "quarantine" and self.quarantine is not None:
            self._quarantine(bad, what if isinstance(what, str) else what.name)

    def __call__(self, table: pa.Table) -> pa.Table:
        import ray

        from slicefeed.transforms import split_errors

        key = _batch_key(self.stage_id, table) if self.counters is not None else None
        if key is not None and self.transforms:
            # Recorded before the transforms run, so a batch that kills its
            # worker is known to the driver by its files and transforms.
            ray.get(self.counters.begin.remote(key, _describe_batch(table, self.transforms)))
        delta = StageCounts()
        _count_op(delta, self.op_before, rows_out=table.num_rows)
        if self.count_input:
            # Records the reader could not decode (mark_errors=True).
            table, bad = split_errors(table)
            unreadable = _whole_files(bad)
            if unreadable is not None:
                # A file whose row count is unknown: no error budget can
                # cover it (before_commit fails the run), and it is not rows.
                delta.unreadable.update(bad.column(PROVENANCE_FILE).filter(unreadable).to_pylist())
                bad = bad.filter(pc.invert(unreadable))
            delta.rows_read = table.num_rows + bad.num_rows
            if bad.num_rows:
                self._handle_bad(bad, "read", delta)
            if RAW_COLUMN in table.column_names:
                table = table.drop_columns([RAW_COLUMN])
        # Steps, not transforms: where two transforms fuse exactly (chain_steps),
        # one call runs both; each keeps its own counters.
        for step in self.steps:
            if table.num_rows == 0:
                # A batch emptied by bad records may lack the data columns
                # (an unreadable file has none); transforms need them.
                break
            n_in = table.num_rows
            t0 = time.perf_counter()
            try:
                out = step.fn(table)
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise _type_mismatch(self.transforms[step.first], table, e) from None
            table, bad = split_errors(out)
            # A fused step's bad rows are its first transform's; the rest of
            # its transforms see the rows that remain (none: as if the loop
            # had stopped before them).
            for k in range(step.count):
                i = step.first + k
                t = self.transforms[i]
                if k and table.num_rows == 0:
                    break
                tc = delta.transform(self.first_index + i, t)
                tc.rows_in += n_in if k == 0 else table.num_rows
                tc.rows_out += table.num_rows
                if k == 0:
                    tc.rows_bad += bad.num_rows
                    tc.time_s += time.perf_counter() - t0
                if t.reshapes_rows:
                    # Packing merges and splits rows: what goes in is not "filtered".
                    tc.slots, tc.tokens = _padding_counts(table)
            if bad.num_rows:
                self._handle_bad(bad, self.transforms[step.first], delta)
        _count_op(delta, self.op_after, rows_in=table.num_rows)
        if self.local is not None:
            self.local.add(delta)
        if self.counters is not None and delta:
            ray.get(self.counters.add.remote(delta, key))
        return table

    def _quarantine(self, bad: pa.Table, what: str) -> None:
        import hashlib

        import pyarrow.parquet as pq

        # Provenance and reason; for a record the reader could not decode,
        # also its raw bytes.
        keep = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN, RAW_COLUMN)
                if c in bad.column_names]
        rec = bad.select(keep).append_column("transform", pa.array([what] * bad.num_rows, pa.string()))
        # Named by content, so a rerun overwrites rather than duplicates.
        key = hashlib.sha256(repr(rec.select(keep[:2]).to_pydict()).encode()).hexdigest()[:16]
        out = self.quarantine.join(f"{what}-{key}.parquet")
        sink = pa.BufferOutputStream()
        pq.write_table(rec, sink)
        out.fs.makedirs(self.quarantine.path, exist_ok=True)
        out.fs.pipe_file(out.path, sink.getvalue().to_pybytes())


def _count_op(delta: StageCounts, op: tuple[int, Any] | None, *, rows_in: int = 0,
              rows_out: int = 0) -> None:
    """Adds rows into / out of the dataset-level op ``op`` (``(index, transform)``,
    or None: nothing) to ``delta``, the report of the batch stage next to it."""
    if op is None or not (rows_in or rows_out):
        return
    tc = delta.transform(*op)
    tc.dataset_op = True
    tc.rows_in += rows_in
    tc.rows_out += rows_out


@dataclasses.dataclass
class RunReport:
    """What a run read, wrote and dropped, and how fast.

    ``rows_read == rows_written + rows_filtered + rows_skipped + rows_quarantined``
    when no transform reshapes rows. With packing (``reshaped``), rows before
    and after it are different units: ``rows_read`` equals the rows filtered,
    skipped or quarantined before it plus its ``rows_in``, and its ``rows_out``
    equals ``rows_written`` plus what was removed after it. ``filtered_by``
    splits ``rows_filtered`` by transform name, dataset-level ops
    (``deduplicate``) included.
    """

    name: str
    status: str  # "committed" | "already_committed"
    sink: str
    fingerprint: str
    rows_read: int
    rows_written: int
    rows_filtered: int
    rows_skipped: int
    rows_quarantined: int
    files: int
    bytes_written: int
    wall_s: float
    rows_per_s: float
    filtered_by: dict[str, int] = dataclasses.field(default_factory=dict)
    fit_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Row-reshaping transforms (packing): rows in and rows out of each.
    reshaped: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    ray_stats: str = ""
    #: Per source: uri, format, files, bytes (input size), rows_read; for a
    #: mixture also name, rows (good rows taken), weight (as in the spec),
    #: proportion (normalised weight), realised fraction, and rows_not_taken
    #: (records past the source's quota; rows_read + rows_not_taken are its
    #: records); for a
    #: folder holding files not named for the format (not read),
    #: files_left_out and first_left_out.
    sources: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    bytes_read: int = 0
    versions: dict[str, str] = dataclasses.field(default_factory=_versions)
    run_id: str = ""
    #: One entry per transform of the spec that ran in a batch stage, in
    #: order: index, name, rows_in, rows_out, rows_bad, time_s (summed over
    #: tasks), and for packing ``packing_efficiency`` (non-padding / all slots).
    transforms: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Arrow bytes of the rows handed to the writer (in memory; what Ray's
    #: "data written" counts). ``bytes_written`` is the Parquet size on disk.
    bytes_in_memory: int = 0
    #: Shards of an earlier, unfinished run of the same pipeline over the same
    #: input files that this run verified and committed instead of recomputing.
    shards_reused: int = 0
    #: Input files run as units (one task and one shard each); 0 when the
    #: pipeline cannot run per file (``reuse`` says why).
    units: int = 0
    #: "per input file", or why a rerun recomputes every row.
    reuse: str = ""

    @property
    def packing_efficiency(self) -> float | None:
        """Non-padding fraction of the packed rows, or None if nothing was packed."""
        effs = [t["packing_efficiency"] for t in self.transforms if "packing_efficiency" in t]
        return effs[-1] if effs else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.packing_efficiency is not None:
            d["packing_efficiency"] = self.packing_efficiency
        return d

    def summary(self) -> str:
        """A short human summary (what the CLI prints)."""
        if self.status == "already_committed":
            return (f"{self.name}: {self.sink} is already committed with this pipeline's "
                    f"fingerprint ({self.rows_written} rows); nothing to do.")
        dropped = []
        for tname, r in self.reshaped.items():
            dropped.append(f"{tname} turned {r.get('rows_in', 0)} rows into {r.get('rows_out', 0)}")
        if self.rows_filtered:
            dropped.append(f"{self.rows_filtered} filtered")
        if self.rows_skipped:
            dropped.append(f"{self.rows_skipped} skipped as bad")
        if self.rows_quarantined:
            dropped.append(f"{self.rows_quarantined} quarantined")
        for src in self.sources:
            if src.get("files_left_out"):
                dropped.append(
                    f"did not read {src['files_left_out']} file(s) of {src['uri']} whose names "
                    f"are not those of {src['format']} files, such as {src['first_left_out']!r} "
                    "(name them so, or give a glob that names them)")
        eff = self.packing_efficiency
        if eff is not None:
            dropped.append(f"packing efficiency {eff:.1%}")
        size = f"{self.bytes_written / 1e6:.2f} MB Parquet on disk"
        if self.bytes_in_memory:
            size += f", {self.bytes_in_memory / 1e6:.2f} MB as Arrow in memory"
        if self.shards_reused:
            dropped.append(f"reused the verified shards of {self.shards_reused} of {self.units} input "
                           "files from an earlier run of this pipeline, read "
                           f"{self.bytes_read / 1e6:.2f} MB of input")
        return (
            f"{self.name}: read {self.rows_read} rows, wrote {self.rows_written} rows in "
            f"{self.files} files ({size}) to {self.sink}"
            + (f"; {', '.join(dropped)}" if dropped else "")
            + f". {self.wall_s:.1f} s, {self.rows_per_s:,.0f} rows/s."
        )


class Pipeline:
    """A validated pipeline spec.

    Args:
        spec: A spec dict (see :mod:`slicefeed.pipelines._spec`), validated and
            typed here: :attr:`spec` is the resulting frozen :class:`PipelineSpec`.
        source_name: Where the spec came from, for error messages.
        date: Fixes ``{date}``/``{datetime}`` in source and sink URIs
            (``YYYY-MM-DD``, a date or a datetime; default: now, UTC).
        expand_templates: Fill ``{date}``, ``{datetime}``, ``{env:NAME}`` in
            the URIs (False keeps them, e.g. to ship the spec elsewhere).

    Example:
        >>> p = load_pipeline("pipelines/recipes/text_lm.yaml")  # doctest: +SKIP
        >>> ds = p.dataset()          # lazy ray.data.Dataset
        >>> report = p.run()          # writes the committed sink
    """

    def __init__(self, spec: Mapping[str, Any], *, source_name: str = "pipeline spec",
                 date: Any = None, expand_templates: bool = True):
        checked = validate_spec(spec, source=source_name)
        if expand_templates:
            checked = expand_uri_templates(checked, when=date, source=source_name)
        #: The validated spec, typed (built once, here).
        self.spec: PipelineSpec = PipelineSpec.from_dict(checked)
        self.source_name = source_name
        from slicefeed.transforms import transform_from_spec

        #: Rows taken from each source of a mixture (``sources:``), once built.
        self.mixture_counts: dict[str, int] = {}
        #: Per source of a mixture: records taken (rows_read) and not (rows_not_taken).
        self.mixture_read: dict[str, dict[str, int]] = {}
        self.transforms = [
            self._bind_storage(transform_from_spec(item).with_seed(self.spec.seed))
            for item in self.spec.transforms
        ]

    def _bind_storage(self, t: Any) -> Any:
        """Transforms that read files themselves (``decode_image`` paths) read them
        on a source's filesystem with that source's storage options."""
        bind = getattr(t, "with_source_storage", None)
        if bind is None:
            return t
        try:
            return bind([(s.uri, dict(s.storage)) for s in self.spec.sources])
        except SpecError as e:
            raise SpecError(f"{self.source_name}: {e}") from None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def fingerprint(self) -> str:
        return self.spec.fingerprint

    # -- sources --------------------------------------------------------------

    def _mixture_report(self) -> dict[str, Any]:
        if not self.mixture_counts:
            return {}
        from slicefeed.pipelines._mixture import mixture_report

        return mixture_report(self.mixture_counts, [s.weight for s in self.spec.sources])

    def _retries(self) -> dict[str, Any]:
        """Ray options bounding the reruns of a task whose worker died.

        Ray Data's default (``max_retries=-1``) reruns such a task forever; a
        record that kills its worker every time (a segfault, an OOM kill)
        would make the run loop. Exceptions are not retried either way. Every
        Ray Data call of a run passes these: reads, map stages, dataset-level
        transforms (through :class:`_PipelineTasks`) and the sink's writes.
        """
        return task_retry_options(self.spec.task_retries)

    def _read_source(self, src: SourceSpec, shard: tuple[int, int] | None = None,
                     counters: Any = None) -> ray.data.Dataset:
        from slicefeed.connectors import read_dataset

        opts = dict(src.options)
        watch = _Watch(counters) if counters is not None else None
        if src.format == "dataset":
            with task_retry_args():
                return read_dataset(src.uri, provenance=True, shard=shard, **opts, **src.storage,
                                    ray_remote_args=self._retries(), watch=watch)
        reader = getattr(connectors, get_format(src.format).reader)
        with task_retry_args():
            return reader(
                src.uri, provenance=True, mark_errors=self.spec.on_error != "fail",
                shard=shard, **opts, **src.storage, ray_remote_args=self._retries(), watch=watch,
            )

    def source_schema(self) -> pa.Schema:
        """Schema of the (first) source, read from one file's metadata, without Ray."""
        from slicefeed.connectors import peek_schema

        src = self.spec.sources[0]
        opts = src.options
        if src.format == "dataset":
            schema = read_manifest(src.uri, **src.storage).schema
            cols = opts.get("columns")
            missing = [c for c in cols or () if c not in schema.names]
            if missing:
                raise MissingColumnError(
                    f"{src.uri}: column(s) {missing} not in the dataset; available: "
                    f"{', '.join(schema.names)}. Fix `columns` in the source options."
                )
            schema = pa.schema([schema.field(c) for c in cols]) if cols else schema
            return schema.append(pa.field(PROVENANCE_FILE, pa.string())).append(
                pa.field(PROVENANCE_ROW, pa.int64()))
        return peek_schema(src.format, src.uri, columns=opts.get("columns"),
                           provenance=True, mark_errors=self.spec.on_error != "fail",
                           options=opts, **src.storage)

    def _source_sizes(self) -> list[dict[str, Any]]:
        """uri, format, file count and input bytes of each source (for the report)."""
        from slicefeed.connectors import expand_paths

        out = []
        for src in self.spec.sources:
            entry: dict[str, Any] = {"uri": src.uri, "format": src.format, "files": 0, "bytes": 0}
            try:
                if src.format == "dataset":
                    m = read_manifest(src.uri, **src.storage)
                    entry.update(files=len(m.files), bytes=m.num_bytes)
                else:
                    r = resolve_filesystem(src.uri, **src.storage)
                    left_out: list[str] = []
                    paths = expand_paths(r, suffixes=get_format(src.format).listing_suffixes,
                                         left_out=left_out)
                    entry.update(files=len(paths), bytes=int(sum(r.fs.size(p) or 0 for p in paths)))
                    if left_out:  # a folder's files not named for the format: not read
                        entry.update(files_left_out=len(left_out), first_left_out=printable(
                            left_out[0][len(r.path):].lstrip("/"), 80))
            except (OSError, ValueError):  # informative only
                pass
            out.append(entry)
        return out

    def check_sink(self) -> None:
        """Refuses a sink that equals, contains or lies inside a source (no storage access).

        Raises:
            SpecError: naming the sink and the source.
        """
        if self.spec.sink is not None:
            check_sink_outside_sources(
                self.spec.sink.uri, [s.uri for s in self.spec.sources], where=self.source_name,
            )

    def input_listing(self) -> tuple[InputFile, ...]:
        """The input files (path, size, generation or mtime) this run reads, as listed now.

        Stored in the manifest beside the fingerprint.
        """
        return list_inputs([(s.uri, s.format, dict(s.storage)) for s in self.spec.sources])

    def units_unavailable(self) -> str | None:
        """None when :meth:`run` writes one shard per input file, so that a rerun
        after a crash reuses the files finished before it; else why every row of
        a rerun is recomputed."""
        srcs = self.spec.sources
        if len(srcs) != 1:
            return ("a mixture draws every output block from all sources, so no shard belongs "
                    "to one input file: a rerun recomputes everything")
        src = srcs[0]
        if src.format == "dataset":
            return "a committed-dataset source is not split into units: a rerun recomputes everything"
        opts = dict(src.options)
        if opts.get("shuffle_seed") is not None:
            return "shuffle_seed reorders rows across input files: a rerun recomputes everything"
        for t in self.transforms:
            if t.is_dataset_op:
                return (f"`{t.name}` works on the whole dataset (its output rows depend on other "
                        "input files): a rerun recomputes everything")
            if t.needs_fit:
                return (f"`{t.name}` is fitted on all of the input, so every row depends on every "
                        "input file: a rerun recomputes everything")
        if self.spec.preprocess_on:
            return "placement.preprocess_on runs the job through Ray Data: a rerun recomputes everything"
        extra = set(self.spec.sink.options if self.spec.sink is not None else ()) - {
            "compression", "row_group_size", "row_group_bytes"}
        if extra:
            return (f"sink option(s) {sorted(extra)} size shards across input files: a rerun "
                    "recomputes everything")
        return None

    def _write_units(self, target: Any, transforms: Sequence[Any], *, writer: str,
                     fingerprint: str, overwrite: bool,
                     inputs: Sequence[InputFile], counters: Any, quarantine: Any,
                     report_rel: str, quarantine_rel: str | None, before_commit: Any,
                     metadata: dict[str, Any], info: dict[str, Any]) -> Manifest:
        """One Ray task per input file not finished by an earlier run (see ``connectors._units``)."""
        import ray

        from slicefeed.connectors import expand_paths
        from slicefeed.connectors._units import FileReader, Unit, unit_key, write_units

        src = self.spec.sources[0]
        fmt = get_format(src.format)
        opts = dict(src.options)
        source = resolve_filesystem(src.uri, **dict(src.storage))
        paths = expand_paths(source, suffixes=fmt.listing_suffixes)
        listed = {f.uri: f for f in inputs}
        units = []
        for i, p in enumerate(paths):
            f = listed.get(source.to_uri(p)) or InputFile(source.to_uri(p), source.fs.size(p), None)
            units.append(Unit(i, p, f, unit_key(fingerprint, f)))
        reader = FileReader(
            src.format, source, columns=opts.get("columns"),
            mark_errors=self.spec.on_error != "fail",
            options={k: opts[k] for k in fmt.options if k in opts}, watch=_Watch(counters),
        )
        on_error = self.spec.on_error
        process = _UnitProcess([
            _Stage([], on_error=on_error, counters=counters, quarantine=quarantine, count_input=True),
            _Stage(list(transforms), on_error=on_error, counters=counters,
                   quarantine=quarantine,
                   stage_id="1:" + "+".join(t.name for t in transforms), first_index=0),
            _Output(counters),
        ])

        def on_reused(counts: list[dict[str, Any]]) -> None:
            # The reused units' counters, as their tasks tallied them.
            for c in counts:
                ray.get(counters.add.remote(counts_from_doc(c)))

        sopts = dict(self.spec.sink.options)
        result = write_units(
            target, units, read=reader, process=process, writer_id=writer, overwrite=overwrite,
            fingerprint=fingerprint, metadata=metadata, inputs=inputs, report=report_rel,
            quarantine=quarantine_rel, before_commit=lambda m, _counts: before_commit(m),
            compression=sopts.get("compression", "snappy"),
            row_group_size=sopts.get("row_group_size"),
            row_group_bytes=sopts.get("row_group_bytes"), on_reused=on_reused,
            max_retries=self.spec.task_retries, watch=_Watch(counters),
        )
        info.update(shards_reused=result.reused, units=result.units, bytes_read=result.bytes_read)
        return result.manifest

    def check(self) -> pa.Schema:
        """Checks the sink and the transforms against the source schema; returns the output schema.

        Raises:
            SpecError: naming the transform and the missing/mistyped column,
                or a sink that overlaps a source.
        """
        return self._check(self.transforms)

    def _check(self, transforms: Sequence[Any]) -> pa.Schema:
        """:meth:`check` of ``transforms`` (this pipeline's, perhaps bound to a listing)."""
        from slicefeed.transforms import check_transforms

        self.check_sink()

        schema = self.source_schema()
        try:
            out = check_transforms(schema, transforms)
        except SpecError as e:
            raise SpecError(f"{self.source_name}: {e}") from None
        return pa.schema([f for f in out if f.name not in (PROVENANCE_FILE, PROVENANCE_ROW)])

    # -- the dataset --------------------------------------------------------------

    def _build(self, transforms: Sequence[Any], *, counters: Any = None, quarantine: Any = None,
               shard: tuple[int, int] | None = None, output: bool = False) -> ray.data.Dataset:
        """The read, the transforms (batch stages and dataset-level ops) and, with
        ``output``, the last stage before a writer (provenance dropped, rows counted)."""
        srcs = self.spec.sources
        if len(srcs) == 1:
            ds = self._read_source(srcs[0], shard, counters)
        else:
            from slicefeed.pipelines._mixture import interleave

            self.mixture_read = {}
            ds, self.mixture_counts = interleave(
                {n: self._read_source(s, shard, counters)
                 for n, s in zip(self.spec.source_names, srcs)},
                [s.weight for s in srcs],
                seed=self.spec.seed, read=self.mixture_read,
            )
        on_error = self.spec.on_error
        retries = self._retries()
        # Batch stages between the dataset-level ops: (first index, transforms);
        # the read stage comes first, the ops go between the stages.
        segments: list[tuple[int, list[Any]]] = [(0, [])]
        ops: list[tuple[int, Any]] = []
        for i, t in enumerate(transforms):
            if t.is_dataset_op:
                ops.append((i, t))
                segments.append((i + 1, []))
            else:
                segments[-1][1].append(t)

        def stage(ds: ray.data.Dataset, fn: Any) -> ray.data.Dataset:
            with task_retry_args():
                return ds.map_batches(fn, batch_format="pyarrow", zero_copy_batch=True, **retries)

        # The rows into and out of a dataset-level op are counted by the stages
        # next to it (op_after / op_before): the batch stage before it (the read
        # stage for a first op) and the one after it (the output stage for a
        # last op). Between two ops with no transform in between, one counting
        # stage does both.
        counted = counters is not None
        for k, (first, group) in enumerate(segments):
            before = ops[k - 1] if k and counted else None
            after = ops[k] if k < len(ops) and counted else None
            kwargs: dict[str, Any] = {"on_error": on_error, "counters": counters,
                                      "quarantine": quarantine}
            if k == 0:
                # The read stage, and the transforms before the first op.
                ds = stage(ds, _Stage([], count_input=True, op_after=None if group else after,
                                      **kwargs))
            if group:
                ds = stage(ds, _Stage(group, stage_id=f"{k + 1}:" + "+".join(t.name for t in group),
                                      first_index=first, op_before=before, op_after=after,
                                      **kwargs))
            elif before is not None and (after is not None or not output):
                ds = stage(ds, _Stage([], stage_id=f"{k + 1}:count", op_before=before,
                                      op_after=after, **kwargs))
            if k < len(ops):
                ds = _dataset_op(ops[k][1], ds, _PipelineTasks(self.spec.task_retries, counters))
        if output:
            last = ops[-1] if ops and not segments[-1][1] and counted else None
            ds = stage(ds, _drop_provenance if counters is None else _Output(counters, op_before=last))
        return ds

    def _fitted(self, transforms: Sequence[Any] | None = None) -> list[Any]:
        """``transforms`` (default: this pipeline's) with the ones that need statistics
        fitted over the data before them."""
        fitted: list[Any] = []
        for t in self.transforms if transforms is None else transforms:
            if t.needs_fit and not t.is_fitted:
                upstream = self._build(fitted)
                t = t.fit(upstream)
            fitted.append(t)
        return fitted

    def dataset(self, *, keep_provenance: bool = False,
                shard: tuple[int, int] | None = None) -> ray.data.Dataset:
        """The lazy ``ray.data.Dataset`` this pipeline produces (nothing is written).

        Transforms that need statistics (``needs_fit``) are fitted here, on all
        of the input (also with ``shard``), which runs the pipeline up to them once.
        A file a transform reads (a ``tokenizer.json``) is read here once: the
        dataset tokenizes with that content, without checking the file per
        batch, and a worker that must read it again refuses other content.

        Args:
            keep_provenance: Keep the ``_sf_file``/``_sf_row`` row-identity columns.
            shard: ``(index, count)``: only input files ``index::count`` of every
                source (sorted): one host's deterministic share of whole files.

        Raises:
            SpecError: a source with fewer files than ``count``.
        """
        self.check()
        digests = _rerun.transform_file_digests(self.spec)
        transforms = [t.with_file_digests(digests) for t in self.transforms]
        return self._dataset(self._fitted(transforms), keep_provenance=keep_provenance, shard=shard)

    def _dataset(self, fitted: Sequence[Any], *, keep_provenance: bool = False,
                 counters: Any = None, quarantine: Any = None,
                 shard: tuple[int, int] | None = None) -> ray.data.Dataset:
        """:meth:`dataset` from already fitted transforms, reporting to ``counters``."""
        ds = self._build(fitted, counters=counters, quarantine=quarantine, shard=shard,
                         output=not keep_provenance)
        # Same input, seed and plan -> the same rows in the same order.
        ds.context.execution_options.preserve_order = True
        if self.spec.preprocess_on:
            from slicefeed.pipelines._ops.placement import apply_placement

            apply_placement(ds.context, self.spec.preprocess_on)
        return ds

    # -- batch run -------------------------------------------------------------------

    def _crash_error(self, counters: Any) -> WorkerCrashError | None:
        """The error naming the batch whose worker kept dying, if that ended the run."""
        import ray

        try:
            crashed = ray.get(counters.crashed.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - the original error is reported instead
            return None
        retries = self.spec.task_retries
        dead = [(n, what) for n, what in crashed if n > retries]
        if not dead:
            return None
        n, what = dead[0]
        return WorkerCrashError(
            f"{self.name}: the worker {what} died {n} times (task_retries={retries}); "
            "the run stopped and nothing was committed. That input likely crashes the "
            "step (a segfault or an out-of-memory kill): fix or remove the input, or the "
            "transform, or give the workers more memory, and rerun."
        )

    def _listed(self) -> _rerun.Listed:
        """What this run reads besides its spec, listed from storage now (no Ray):
        the input listing, the SHA-256 of each file the transforms name and the
        listing of each folder they read. Its :meth:`~_rerun.Listed.parts` hash
        to the committed fingerprint."""
        sink = self.spec.sink
        return _rerun.Listed(
            inputs=self.input_listing(),
            files=_rerun.transform_file_digests(self.spec),
            folders=_rerun.transform_folder_listings(
                self.transforms, sink=None if sink is None else sink.uri),
        )

    def _spec_fingerprint(self, listed: _rerun.Listed) -> str:
        """The spec's fingerprint checked against the input listing: a source URI
        named like a file that the listing shows to be a folder has its
        name-dependent reader options decided per file (see :func:`listed_fingerprint`)."""
        return listed_fingerprint(self.spec, {str(i.uri) for i in listed.inputs})

    def fingerprint_parts(self) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """What this run's output depends on, and the input listing, read from storage now.

        Returns ``(parts, listing)``: the parts (spec fingerprint, a digest
        of the input listing, digests of files the transforms read, digests
        of the listings of folders they read, the output format version)
        whose hash is the committed fingerprint, and the listing itself
        (path, size, generation / mtime per input file). No Ray.
        """
        listed = self._listed()
        return listed.parts(self._spec_fingerprint(listed)), listed.inputs

    def _as_listed_now(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """A committed input listing without the files this version leaves out of
        a folder's listing (not named for the format; see ``expand_paths``)."""
        suffixes: list[str] = []
        for src in self.spec.sources:
            fmt = FORMATS.get(src.format)
            if fmt is None or not fmt.listing_suffixes:  # a dataset, or text: every file
                return tuple(inputs)
            suffixes += fmt.listing_suffixes
        return tuple(i for i in inputs if str(i.uri).endswith(tuple(suffixes)))

    def decide(self, *, overwrite: bool = False) -> RunReport | None:
        """Whether a run has anything to do, decided from storage alone (no Ray).

        Returns the ``already_committed`` report when the sink is committed
        with this run's fingerprint (same spec by what it means, written
        however, same input listing, same files read by transforms, same
        listings of folders they read, same output format version); None
        when a run must compute (nothing committed yet, or ``overwrite``).
        A sink committed before specs were fingerprinted by their meaning is
        compared with the spec as written (see :mod:`._rerun`).

        Raises:
            SpecError: the spec has no sink.
            AlreadyCommittedError: the sink holds another pipeline's dataset,
                or this pipeline's from other input; the message says what
                changed and how to proceed.
        """
        sink = self.spec.sink
        if sink is None:
            raise SpecError(f"{self.source_name}: missing required key 'sink' (format and uri) "
                            "to run; use dataset() for a pipeline without a sink.")
        self.check_sink()
        return self._decide(self._listed(), overwrite=overwrite)

    def _decide(self, listed: _rerun.Listed, *, overwrite: bool) -> RunReport | None:
        """:meth:`decide` for inputs as ``listed`` (the sink checked already)."""
        sink = self.spec.sink
        target = resolve_filesystem(sink.uri, **sink.storage)
        parts, inputs = listed.parts(self._spec_fingerprint(listed)), listed.inputs
        fp = _rerun.combine(parts)
        if overwrite or not is_committed(target):
            return None
        existing = read_manifest(target)  # CorruptManifestError: --overwrite replaces it
        if existing.fingerprint == fp:
            return _already_committed(self.name, target.uri, fp, existing)
        old_parts = existing.metadata.get(_rerun.PARTS_KEY)
        # Committed before specs were fingerprinted by their meaning: compared in
        # the form that slicefeed wrote (the spec as written).
        written = _rerun.written_form(old_parts)
        mine = _rerun.as_written_form(parts, self.spec.written_fingerprint) if written else parts
        if written and _rerun.combine(mine) == existing.fingerprint:
            return _already_committed(self.name, target.uri, existing.fingerprint, existing)
        if (isinstance(old_parts, dict) and existing.inputs is not None
                and _rerun.same_but_listing(old_parts, mine)
                and _rerun.listing_digest(self._as_listed_now(existing.inputs)) == parts["inputs"]):
            # Committed by a slicefeed that also listed a folder's files not named
            # for the format (never read): the same input.
            return _already_committed(self.name, target.uri, existing.fingerprint, existing)
        old_spec = old_parts.get("spec") if isinstance(old_parts, dict) else existing.fingerprint
        if old_spec != mine["spec"]:
            raise AlreadyCommittedError(
                f"{target.uri} already holds a committed dataset written by another pipeline "
                f"(fingerprint {existing.fingerprint}, this one is {fp})"
                + (", or by this one written differently: it was committed by an earlier "
                   "slicefeed, which compared specs as written, so a spec that differs from "
                   "the committed one only in how it is written (spaces in an expression, a "
                   "trailing slash, a default written out) is not recognised there, nor is "
                   "a spec holding a YAML date or timestamp (recorded there as the text "
                   "that a string with other values also has). Run the spec as it was "
                   "written then, or pass --overwrite (Pipeline.run("
                   "overwrite=True)) to recompute it once (later reruns compare specs by "
                   "what they mean), or change sink.uri." if written else
                   ". Pass --overwrite (Pipeline.run(overwrite=True)) to replace it, or "
                   "change sink.uri.")
            )
        old_folders = existing.metadata.get(_rerun.FOLDERS_KEY)
        reasons = _rerun.what_changed(
            old_parts if isinstance(old_parts, dict) else None, mine, existing.inputs, inputs,
            old_folders if isinstance(old_folders, dict) else None,
            _rerun.folder_metadata(listed.folders))
        raise AlreadyCommittedError(
            f"{target.uri} is committed by this pipeline from other input: "
            f"{'; '.join(reasons)}. Pass --overwrite (Pipeline.run(overwrite=True)) to recompute "
            f"it in place, or give each run its own dataset with a dated sink "
            f"(--set 'sink.uri={_rerun.dated(sink.uri)}')."
        )

    def run(self, *, overwrite: bool = False, progress: bool = False,
            progress_interval: float | None = None) -> RunReport:
        """Runs the pipeline and commits its sink.

        If the sink is already committed with this pipeline's fingerprint the
        run does nothing and reports ``status="already_committed"``.

        Args:
            overwrite: Replace a sink committed by another pipeline.
            progress: Print progress in rows per transform to stderr while the
                run writes (see :mod:`slicefeed.pipelines._progress`).
            progress_interval: Seconds between progress lines (default 1 on a
                terminal, 10 in a log).

        Raises:
            SpecError: the spec has no sink, or a transform does not fit the source.
            AlreadyCommittedError: the sink holds another pipeline's dataset and
                ``overwrite`` is False.
            BadRecordError: a bad record under ``on_error: fail``, or more bad
                records than ``max_error_fraction`` allows.
        """
        import ray

        from slicefeed.connectors import write_parquet

        sink = self.spec.sink
        if sink is None:
            raise SpecError(f"{self.source_name}: missing required key 'sink' (format and uri) "
                            "to run; use dataset() for a pipeline without a sink.")
        self.check_sink()
        storage = dict(sink.storage)
        target = resolve_filesystem(sink.uri, **storage)
        # Listed once: the same listing is fingerprinted, recorded in the manifest
        # and (file digests) bound to the transforms that read those files.
        listed = self._listed()
        decided = self._decide(listed, overwrite=overwrite)
        if decided is not None:
            return decided
        parts, inputs = listed.parts(self._spec_fingerprint(listed)), listed.inputs
        fp = _rerun.combine(parts)
        corrupt = False
        if overwrite and is_committed(target):
            try:
                read_manifest(target)
            except connectors.CorruptManifestError:
                corrupt = True  # replaced by a full run (the writer keeps the bad file aside)
        t0 = time.perf_counter()
        # The transforms that read a file (a tokenizer.json) use the content the
        # fingerprint records, and refuse the file if it changed since.
        transforms = [t.with_file_digests(listed.files) for t in self.transforms]
        self._check(transforms)
        fitted = self._fitted(transforms)
        counters = _counters_actor()
        # Everything this run writes beside the data is named by its writer id
        # and recorded in its manifest version: a failed or losing run leaves
        # the committed version's report and quarantine alone.
        writer = new_writer_id()
        quarantine_rel = f"{QUARANTINE_DIR}/{writer}" if self.spec.on_error == "quarantine" else None
        quarantine = target.join(quarantine_rel) if quarantine_rel else None
        report_rel = f"{REPORTS_DIR}/{writer}.json"
        ds = (self._dataset(fitted, counters=counters, quarantine=quarantine)
              if self.units_unavailable() is not None or corrupt else None)
        fit_stats = {f"{i}:{t.name}": t.stats() for i, t in enumerate(fitted) if t.stats()}
        max_frac = self.spec.max_error_fraction

        def before_commit(manifest: Manifest) -> None:
            c: StageCounts = ray.get(counters.get.remote())
            unreadable = sorted(c.unreadable)
            if unreadable:
                raise BadRecordError(
                    f"{self.name}: {len(unreadable)} input file(s) could not be read at all "
                    f"({', '.join(repr(f) for f in unreadable[:5])}"
                    f"{' ...' if len(unreadable) > 5 else ''}): their row count is unknown, so "
                    "no max_error_fraction can cover them; nothing was committed. Replace or "
                    "remove them and rerun."
                )
            bad, read = c.rows_bad, c.rows_read
            if read and bad / read > max_frac:
                raise BadRecordError(
                    f"{self.name}: {bad} of {read} rows were bad ({bad / read:.2%}), more than "
                    f"max_error_fraction={max_frac}; nothing was committed. Fix the input or "
                    "raise max_error_fraction."
                )

        # Folder listings (for a later run's "what changed"), only where a
        # transform reads a folder: other manifests do not carry it.
        folder_meta = ({_rerun.FOLDERS_KEY: _rerun.folder_metadata(listed.folders)}
                       if listed.folders else {})
        why_not = self.units_unavailable() if not corrupt else (
            "the committed manifest could not be parsed; it is replaced by a full run")
        unit_info: dict[str, Any] = {"reuse": why_not or "per input file", "shards_reused": 0,
                                     "units": 0, "bytes_read": None}

        def write() -> Manifest:
            if why_not is None:
                return self._write_units(
                    target, fitted, writer=writer, fingerprint=fp, overwrite=overwrite, inputs=inputs,
                    counters=counters, quarantine=quarantine, report_rel=report_rel,
                    quarantine_rel=quarantine_rel, before_commit=before_commit,
                    metadata={"pipeline": self.name, "seed": self.spec.seed,
                              "fit_stats": fit_stats, _rerun.PARTS_KEY: parts, **folder_meta},
                    info=unit_info,
                )
            return write_parquet(
                ds, target.uri, fingerprint=fp, overwrite=overwrite,
                metadata={"pipeline": self.name, "seed": self.spec.seed, "fit_stats": fit_stats,
                          _rerun.PARTS_KEY: parts, **folder_meta},
                before_commit=before_commit, inputs=inputs, writer_id=writer, report=report_rel,
                quarantine=quarantine_rel, ray_remote_args=self._retries(),
                watch=_Watch(counters), **dict(sink.options), **storage,
            )

        try:
            if progress:
                from slicefeed.pipelines._progress import Progress

                with Progress(self.name, lambda: ray.get(counters.get.remote(), timeout=30),
                              interval=progress_interval):
                    manifest = write()
            else:
                manifest = write()
        except (CommitConflictError, AlreadyCommittedError) as e:
            # Another run committed first (while this one wrote, or since the
            # check above). Same pipeline over the same inputs: its result is
            # this run's result.
            _release_counters(counters, reuse=False)
            version = getattr(e, "version", None)
            if version is not None or isinstance(e, AlreadyCommittedError):
                winner = read_manifest(target, version=version)
                if winner.fingerprint == fp and winner.inputs == inputs:
                    return _already_committed(self.name, target.uri, fp, winner)
            raise
        except Exception as e:
            crash = self._crash_error(counters) if _worker_died(e) else None
            _release_counters(counters, reuse=False)
            if crash is None:
                raise
            raise crash from None
        wall = time.perf_counter() - t0
        c: StageCounts = ray.get(counters.get.remote())
        _release_counters(counters, reuse=True)
        sources = self._source_sizes()
        if len(sources) == 1:
            sources[0]["rows_read"] = c.rows_read
        mixture = self._mixture_report()
        for src, name in zip(sources, self.spec.source_names):
            if name in mixture:
                src.update(name=name, **mixture[name], **self.mixture_read.get(name, {}))
        skipped, quarantined = c.rows_skipped, c.rows_quarantined
        filtered_by = c.filtered_by()
        reshaped = c.reshaped()
        read = c.rows_read
        report = RunReport(
            name=self.name, status="committed", sink=target.uri, fingerprint=fp,
            rows_read=read, rows_written=manifest.num_rows,
            # Without packing, "filtered" is what is left once the rest is
            # accounted for; with it, rows before and after it are different
            # units: the sum of what each transform removed (dataset-level ops,
            # counted by the stages next to them, included).
            rows_filtered=(
                read - manifest.num_rows - skipped - quarantined if not reshaped
                else sum(filtered_by.values())
            ),
            reshaped=reshaped,
            rows_skipped=skipped, rows_quarantined=quarantined,
            files=len(manifest.files), bytes_written=manifest.num_bytes, wall_s=wall,
            rows_per_s=read / wall if wall > 0 else 0.0, filtered_by=filtered_by,
            fit_stats=fit_stats, ray_stats=_ray_stats(ds) if ds is not None else "",
            sources=sources,
            bytes_read=(sum(src["bytes"] for src in sources) if unit_info["bytes_read"] is None
                        else unit_info["bytes_read"]),
            shards_reused=unit_info["shards_reused"], units=unit_info["units"],
            reuse=unit_info["reuse"],
            run_id=manifest.metadata.get("run_id", ""),
            transforms=c.transform_rows(), bytes_in_memory=c.bytes_out,
        )
        doc = json.dumps(report.to_dict(), indent=2, default=str).encode()
        write_atomic(target.join(report_rel), doc)
        # Convenience copy for the latest commit; the manifest names the report.
        write_atomic(target.join(REPORT_NAME), doc)
        return report


def _dataset_op(t: Any, ds: ray.data.Dataset, tasks: DatasetTasks) -> ray.data.Dataset:
    """``t.dataset_op(ds, tasks=tasks)``; a transform whose ``dataset_op`` predates
    ``tasks`` gets Ray Data's defaults for its tasks."""
    import inspect

    if "tasks" in inspect.signature(t.dataset_op).parameters:
        return t.dataset_op(ds, tasks=tasks)
    return t.dataset_op(ds)


def _worker_died(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) is Ray reporting a dead worker process."""
    import ray

    died = (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError,
            ray.exceptions.NodeDiedError, ray.exceptions.ActorDiedError)
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, died):
            return True
        nxt = getattr(cur, "cause", None)
        cur = nxt if isinstance(nxt, BaseException) else (cur.__cause__ or cur.__context__)
    return False


def _whole_files(bad: pa.Table) -> pa.Array | None:
    """Mask of the reader's whole-file markers in ``bad``: no row and no raw bytes."""
    from slicefeed.connectors._readers import RAW_COLUMN

    if not bad.num_rows or PROVENANCE_ROW not in bad.column_names:
        return None
    mask = pc.is_null(bad.column(PROVENANCE_ROW))
    if RAW_COLUMN in bad.column_names:
        mask = pc.and_(mask, pc.is_null(bad.column(RAW_COLUMN)))
    mask = mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
    return mask if pc.any(mask).as_py() else None


def _already_committed(name: str, uri: str, fp: str, m: Manifest) -> RunReport:
    return RunReport(
        name=name, status="already_committed", sink=uri, fingerprint=fp,
        rows_read=0, rows_written=m.num_rows, rows_filtered=0, rows_skipped=0,
        rows_quarantined=0, files=len(m.files), bytes_written=m.num_bytes,
        wall_s=0.0, rows_per_s=0.0, run_id=m.metadata.get("run_id", ""),
    )


def _ray_stats(ds: ray.data.Dataset) -> str:
    try:
        return ds.stats()
    except Exception:  # noqa: BLE001 - stats are informative only
        return ""


def _drop_provenance(table: pa.Table) -> pa.Table:
    drop = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c in table.column_names]
    return table.drop_columns(drop) if drop else table


class _Output:
    """The last stage before the writer: drops provenance, counts rows and in-memory bytes
    (and, when the last transform is a dataset-level op, its ``rows_out``: see ``_Stage.op_before``)."""

    def __init__(self, counters: Any, op_before: tuple[int, Any] | None = None):
        self.counters = counters
        self.op_before = op_before
        self.local: StageCounts | None = None

    def __call__(self, table: pa.Table) -> pa.Table:
        import ray

        key = _batch_key("output", table)
        table = _drop_provenance(table)
        if table.num_rows:
            delta = StageCounts(rows_out=table.num_rows, bytes_out=table.nbytes)
            _count_op(delta, self.op_before, rows_out=table.num_rows)
            if self.local is not None:
                self.local.add(delta)
            ray.get(self.counters.add.remote(delta, key))
        return table


def counts_doc(c: StageCounts) -> dict[str, Any]:
    """``c`` as JSON-able data (a unit's side record keeps its counters)."""
    d = dataclasses.asdict(c)
    d["transforms"] = [dataclasses.asdict(t) for t in c.transforms.values()]
    d["unreadable"] = sorted(c.unreadable)
    return d


def counts_from_doc(d: Mapping[str, Any]) -> StageCounts:
    d = dict(d)
    tcs = [TransformCounts(**t) for t in d.pop("transforms", ())]
    unreadable = set(d.pop("unreadable", ()))
    return StageCounts(**d, transforms={t.index: t for t in tcs}, unreadable=unreadable)


class _UnitProcess:
    """A unit task's transform: every stage over one input file's rows, and their counters."""

    def __init__(self, stages: Sequence[Any]):
        self.stages = list(stages)

    def __call__(self, table: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
        counts = StageCounts()
        for st in self.stages:
            st.local = counts
            table = st(table)
        return table, counts_doc(counts)


def _padding_counts(table: pa.Table) -> tuple[int, int]:
    """(slots, non-padding slots) of a packed batch (``segment_ids`` 0 = padding)."""
    import pyarrow.compute as pc

    if "segment_ids" not in table.column_names or table.num_rows == 0:
        return 0, 0
    col = table.column("segment_ids")
    if isinstance(col.type, pa.FixedShapeTensorType):
        col = pa.chunked_array([c.storage for c in col.chunks], col.type.storage_type)
    if not pa.types.is_fixed_size_list(col.type) and not pa.types.is_list(col.type):
        return 0, 0
    values = pc.list_flatten(col)
    return len(values), int(pc.sum(pc.not_equal(values, 0)).as_py() or 0)


def load_pipeline(path: str | os.PathLike[str], overrides: Sequence[str] | Mapping[str, Any] | None = None,
                  *, date: Any = None) -> Pipeline:
    """Loads and validates a YAML pipeline spec.

    Args:
        path: The YAML file.
        overrides: ``["sink.uri=/tmp/out", "seed=3"]`` or ``{"sink.uri": "/tmp/out"}``.
        date: The run date for ``{date}``/``{datetime}`` in URIs (default: today, UTC).

    Raises:
        SpecError: naming the offending key and the allowed values.
    """
    spec = load_spec(path, overrides)
    return Pipeline(spec, source_name=os.fspath(path), date=date)
