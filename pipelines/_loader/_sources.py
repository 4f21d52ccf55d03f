"""Sources: where a host's rows come from, behind one small protocol.

A source turns ``(epoch, first row)`` into Arrow tables of exactly
``ReadContext.batch_rows`` rows (the last one of an epoch may be shorter),
given a :class:`ReadContext` that says everything it may know about the
loader. Sources never see the loader itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from slicefeed.connectors import SpecError, _compat
from slicefeed.pipelines._loader import _plan, _shards


@dataclasses.dataclass(frozen=True)
class ReadContext:
    """What a source needs to produce one host's epoch."""

    batch_rows: int
    columns: tuple[str, ...]
    seed: int
    shuffle: bool
    shuffle_buffer_rows: int
    window_rows: int
    process_index: int
    process_count: int
    reader: str
    read_ahead: int
    ray_prefetch_batches: int
    stop: threading.Event
    # Rows of this host's share to read per epoch (``None``: all); rows beyond it
    # are dropped by the equal-step plan and never read.
    limit_rows: int | None = None
    # A committed dataset's epoch resumed on another host layout: the rows this
    # host delivers in that epoch (``_plan.elastic_epoch``); ``None``: the plan.
    spans: tuple[_plan.Span, ...] | None = None
    # Receives read counters (rows_decoded, rows_decoded_peak, host_copies,
    # host_copy_bytes) as a dict; may be called from reader threads.
    on_read: Callable[[dict], None] | None = None
    # Called, in the thread iterating the tables, each time one of the epoch's
    # ``read_ahead`` readers is free with nothing of the epoch left to read
    # (``reader="local"``): a run of the next epoch may take its place, so the
    # runs in flight stay within the read-ahead bound (see :class:`_LocalRuns`).
    on_spare_reader: Callable[[], None] | None = None
    # Checks a table a Ray source delivered against the conversion plan
    # (``_convert.check_table``): a shuffle checks each before it meets others.
    check: Callable[[pa.Table], None] | None = None


class Source(Protocol):
    kind: str

    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows (no read beyond metadata where possible)."""

    def fingerprint(self) -> dict:
        """What identifies the data in a saved state."""

    def share_sizes(self, process_count: int) -> list[int] | None:
        """Every host's rows per epoch if known without reading or talking; else None."""

    def local_rows(self) -> int | None:
        """This host's rows per epoch if known without reading; else None."""

    def tables(self, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
        """The epoch's tables from row ``skip_rows`` (a multiple of ``ctx.batch_rows``)."""

    def locate(self, epoch: int, row: int, ctx: ReadContext) -> str:
        """Names the ``row``-th row this host delivers in ``epoch`` (for error messages)."""


def arrow_schema(schema: Any) -> pa.Schema:
    """An Arrow schema from a Ray Data ``Schema`` of Arrow *or* pandas blocks."""
    if schema is None:
        raise SpecError("JaxLoader: the source has no schema (is it empty?).")
    if isinstance(schema, pa.Schema):
        return schema
    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema):
        return base
    # Pandas blocks: Ray gives each column's Arrow type (or a dtype that has one);
    # Ray converts pandas blocks to Arrow for batch_format="pyarrow", which is
    # how the loader reads them.
    fields = []
    for name, t in zip(schema.names, schema.types):
        try:
            if isinstance(t, pa.DataType):
                at = t
            elif hasattr(t, "to_arrow_dtype"):
                at = t.to_arrow_dtype()
            else:
                at = pa.from_numpy_dtype(t)
        except Exception as e:
            raise SpecError(
                f"JaxLoader: column {name!r} has type {t}, which has no Arrow equivalent; "
                "convert or exclude it in the pipeline."
            ) from e
        fields.append(pa.field(name, at))
    return pa.schema(fields)


def _batches_of(tables: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """Tables of exactly ``rows`` rows (the last one may be shorter). Slices are
    zero-copy; only a batch spanning two input tables is chunked."""
    carry = None
    for t in tables:
        if carry is not None:
            t = pa.concat_tables([carry, t])
            carry = None
        n, i = t.num_rows, 0
        while n - i >= rows:
            yield t.slice(i, rows)
            i += rows
        if i < n:
            carry = t.slice(i)
    if carry is not None:
        yield carry


# --------------------------------------------------------------------------- Ray Data


class RaySource:
    """A ``ray.data.Dataset`` (read in block order) or a ``DataIterator``.

    ``first_read`` = ``(batch_rows, prefetch_batches)`` of an unshuffled read:
    a ``DataIterator`` without a static schema then learns it from its first
    batch, and that read goes on as the first epoch. Ray's own
    ``DataIterator.schema()`` executes the dataset up to its first block (a
    streaming split's coordinator runs ``Dataset.schema()``): on a live
    pipeline, the first stage once more before the epoch starts.
    """

    def __init__(self, obj: Any, kind: str, schema: pa.Schema | None = None,
                 first_read: tuple[int, int] | None = None):
        self.kind = kind
        self._schema = schema  # known statically (a Pipeline's checked output schema)
        self._first_read = first_read
        # The started first read (its first table included), until tables() takes it.
        self._primed: Iterator[pa.Table] | None = None
        if kind == "dataset":
            self.obj = _compat.dataset_preserving_order(obj)
            self._local_rows = _compat.dataset_meta_count(self.obj)
        else:
            self.obj = obj
            self._local_rows = None

    def schema(self) -> pa.Schema:
        if self._schema is not None:
            return self._schema
        if self.kind == "iterator" and self._first_read is not None and self._primed is None:
            rows, prefetch = self._first_read
            it = iter(self.obj.iter_batches(batch_size=rows, batch_format="pyarrow",
                                            prefetch_batches=prefetch, drop_last=False))
            first = next(it, None)
            if first is not None:
                self._primed = itertools.chain([first], it)
                self._schema = first.schema
                return self._schema
            self._primed = iter(())  # this host's share of the epoch is empty
        # Ray may execute the Dataset (its first block) to answer this.
        return arrow_schema(self.obj.schema())

    def fingerprint(self) -> dict:
        return {"source": self.kind}

    def share_sizes(self, process_count: int) -> list[int] | None:
        return [self._local_rows] if process_count == 1 and self._local_rows is not None else None

    def local_rows(self) -> int | None:
        return self._local_rows

    def tables(self, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
        primed, self._primed = self._primed, None
        if primed is not None and not ctx.shuffle and (
                ctx.batch_rows, ctx.ray_prefetch_batches) == self._first_read:
            # A DataIterator's next iteration is its next epoch, whatever the number.
            return _skip_batches(primed, skip_rows // ctx.batch_rows, ctx.on_read)
        return _ray_tables(self.obj, epoch, skip_rows, ctx)

    def locate(self, epoch: int, row: int, ctx: ReadContext) -> str:
        return f"row {row} of this host's epoch {epoch} (the source has no file positions)"


def _skip_batches(tables: Iterator[pa.Table], n: int, on_read=None) -> Iterator[pa.Table]:
    """``tables`` without its first ``n`` (no row positions: read and discard);
    ``on_read`` hears of every table read (rows Ray produced for this host)."""
    for table in tables:
        if on_read is not None:
            on_read({"rows_decoded": table.num_rows})
        if n:
            n -= 1
            continue
        yield table


def _ray_tables(obj: Any, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
    """Arrow tables of ``ctx.batch_rows`` rows from a Dataset / DataIterator (any block
    format: Ray converts pandas blocks), shuffled by :func:`shuffled` if asked."""
    it = iter(obj.iter_batches(
        batch_size=ctx.batch_rows,
        batch_format="pyarrow",
        prefetch_batches=ctx.ray_prefetch_batches,
        drop_last=False,
    ))
    if ctx.shuffle:
        it = shuffled(_aligned(it, ctx), ctx.batch_rows, ctx.shuffle_buffer_rows,
                      (ctx.seed * 1_000_003 + epoch) % (2**32))
    yield from _skip_batches(it, skip_rows // ctx.batch_rows, ctx.on_read)


def _aligned(tables: Iterator[pa.Table], ctx: ReadContext) -> Iterator[pa.Table]:
    """The delivered columns of each table, in the first table's types: each is
    checked against the plan (``ctx.check``) before the shuffle mixes it with
    others, which would hide a block of another type, a missing column or
    another bfloat16 marker. The types the check lets through convert alike
    and are cast to the first block's, which Arrow needs to concatenate them
    (``list`` and ``large_list``); where Arrow has no such cast (a tensor and
    a nested ``fixed_size_list``) the shuffle refuses them."""
    cols = list(ctx.columns)
    first: pa.Schema | None = None
    for table in tables:
        if ctx.check is not None:
            ctx.check(table)
        table = table.select(cols)
        if first is None:
            first = table.schema
        elif not table.schema.equals(first):
            try:
                table = table.cast(first)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                from slicefeed.connectors import SpecError, typed_columns

                theirs, ours = typed_columns(table.schema), typed_columns(first)
                raise SpecError(
                    f"JaxLoader: a block the source delivered has columns {theirs} and an "
                    f"earlier one {ours}; they convert alike, but a shuffle has to put them in "
                    "one table and Arrow cannot cast one to the other. Give the blocks one "
                    "type in the pipeline (a cast transform), or read without shuffle.") from None
        yield table


def shuffled(tables: Iterator[pa.Table], batch_rows: int, buffer_rows: int,
             seed: int) -> Iterator[pa.Table]:
    """Tables of ``batch_rows`` rows (the last one shorter) drawn at random from
    a buffer of at least ``buffer_rows`` rows, as a function of the rows' order
    and ``seed`` only: not of how the source cut them into tables (Ray's local
    shuffle buffer follows its blocks, and a source may cut the same rows
    otherwise on every run, a mixture's sort for one), so a resumed epoch,
    replayed and skipped to its step, repeats the batches already delivered.

    Whenever the buffer reaches exactly ``2 * buffer_rows`` rows it is permuted
    once and all but ``buffer_rows`` of them (whole batches) are delivered:
    each row is copied about twice. Tables whose types differ (a column all
    null in one) are unified as Ray's own buffer did.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    buffer_rows = max(int(buffer_rows), batch_rows)
    full = 2 * buffer_rows
    held: list[pa.Table] = []
    rows = 0

    def draw(keep: int) -> Iterator[pa.Table]:
        nonlocal held, rows
        try:
            table = pa.concat_tables(held, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            from slicefeed.connectors import SpecError, printable

            raise SpecError(
                f"JaxLoader: the source's blocks differ in columns or types "
                f"({printable(str(e), 200)}), and a shuffle would have to mix them; give "
                "every block the same columns and types in the pipeline (select / cast), "
                "or leave the column out with exclude=[...].") from None
        order = rng.permutation(table.num_rows)
        give = (table.num_rows - keep) // batch_rows * batch_rows if keep else table.num_rows
        out = table.take(order[:give])
        held, rows = [table.take(order[give:])], table.num_rows - give
        for start in range(0, give, batch_rows):
            yield out.slice(start, batch_rows)

    for table in tables:
        while table.num_rows:
            part = table.slice(0, full - rows)
            table = table.slice(part.num_rows)
            held.append(part)
            rows += part.num_rows
            if rows == full:
                yield from draw(keep=buffer_rows)
    if rows:
        yield from draw(keep=0)


# --------------------------------------------------------------------------- committed


def _open_shard(f: Any, path: str, expect: list[int] | None) -> Any:
    """A ``ParquetFile`` of a committed shard, checked against the manifest's
    ``[num_rows, num_bytes]`` when given (a replaced or truncated shard would
    give hosts different step counts)."""
    import pyarrow.parquet as pq

    from slicefeed.connectors import CorruptFileError, ShardMismatchError

    size = getattr(f, "size", None)
    size = size() if callable(size) else size  # an Arrow NativeFile's is a method
    if expect is not None and size is not None and int(size) != expect[1]:
        raise ShardMismatchError(
            f"{path}: {int(size)} bytes, the manifest says {expect[1]}. The shard was replaced "
            "or truncated after the commit; rewrite the dataset with --overwrite.")
    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise CorruptFileError(f"{path}: not a readable Parquet file ({str(e)[:200]}).") from None
    if expect is not None and pf.metadata.num_rows != expect[0]:
        raise ShardMismatchError(
            f"{path}: {pf.metadata.num_rows} rows, the manifest says {expect[0]}. The shard was "
            "replaced after the commit; rewrite the dataset with --overwrite.")
    return pf


#: Schema metadata key under which a Ray read task reports its counters.
READ_COUNTERS_KEY = b"slicefeed.read"


def _overlapping_groups(pf: Any, lo: int, hi: int) -> tuple[list[int], int, bool]:
    """Row groups of ``pf`` overlapping rows ``[lo, hi)``, the first one's first
    row, and whether ``[lo, hi)`` is exactly those row groups."""
    md = pf.metadata
    idx, first, pos, end = [], None, 0, 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if pos + n > lo and pos < hi:
            idx.append(g)
            first = pos if first is None else first
            end = pos + n
        pos += n
    first = lo if first is None else first
    return idx, first, first == lo and end == hi


class _Stream:
    """Rows ``[lo, hi)`` of one shard decoded in order, ``batch_rows`` at a time
    (``ParquetFile.iter_batches`` over the row groups they overlap): a row group
    larger than a window is never decoded whole. Rows before ``lo`` in its first
    row group are decoded and discarded (a host boundary or a resume point
    inside a row group)."""

    def __init__(self, pf: Any, lo: int, hi: int, columns: list[str], batch_rows: int,
                 counters: dict, conform: Callable[[pa.Table], pa.Table] = lambda t: t):
        idx, first, _ = _overlapping_groups(pf, lo, hi)
        self.pos = lo  # next row this stream delivers
        self._at = first  # file row of the next decoded batch's first row
        self._hi = hi
        self._it = pf.iter_batches(batch_size=max(1, batch_rows), row_groups=idx,
                                   columns=columns)
        self._carry: tuple[pa.Table, int, int] | None = None
        self._counters = counters
        self._conform = conform  # each decoded table, before it meets another's rows

    def take(self, n: int) -> list[tuple[pa.Table, int, int]]:
        """The next ``n`` rows as ``(unsliced table, a, z)`` parts (rows ``a:z``)."""
        out = []
        while n > 0:
            if self._carry is None:
                batch = next(self._it)
                t = self._conform(pa.Table.from_batches([batch]))
                self._counters["rows_decoded"] += t.num_rows
                a = max(self.pos - self._at, 0)
                self._carry = (t, a, min(t.num_rows, self._hi - self._at))
                self._at += t.num_rows
                if a >= self._carry[2]:
                    self._carry = None  # wholly before lo
                    continue
            t, a, z = self._carry
            k = min(n, z - a)
            out.append((t, a, a + k))
            self._carry = (t, a + k, z) if a + k < z else None
            n -= k
            self.pos += k
        return out


def _window_table(parts: list[tuple[pa.Table, int, int]], shuffle: bool, rng: list[int],
                  skip: int, stop: int | None, counters: dict) -> pa.Table:
    """Rows ``[skip, stop)`` of one window (in delivery order: permuted if
    shuffling) from its parts (unsliced tables and row ranges)."""
    held = sum(t.num_rows for t, _, _ in {id(p[0]): p for p in parts}.values())
    counters["rows_decoded_peak"] = max(counters["rows_decoded_peak"], held)
    if not shuffle:
        table = pa.concat_tables([t.slice(a, z - a) for t, a, z in parts])
        if stop is not None:
            return table.slice(skip, stop - skip)
        return table.slice(skip) if skip else table
    tables, positions, base, seen = [], [], 0, {}
    for t, a, z in parts:
        if id(t) not in seen:
            seen[id(t)] = base
            tables.append(t)
            base += t.num_rows
        positions.append(seen[id(t)] + np.arange(a, z))
    order = np.concatenate(positions)
    order = order[_plan.window_permutation(rng, len(order))][skip:stop]
    # take() on the unsliced tables: pyarrow 26's take on a *sliced* nested
    # fixed_size_list array returns wrong rows (tests/pipelines/test_loader.py::
    # test_pyarrow_nested_fsl_take_bug documents it); offsets 0 are safe.
    out = pa.concat_tables(tables).take(pa.array(order))
    counters["host_copies"] += out.num_columns  # the permutation copies every column
    counters["host_copy_bytes"] += out.nbytes
    return out


def _coalesce(pieces: list) -> list[tuple[str, int, int]]:
    """``pieces`` with file-contiguous neighbours merged, so consecutive row groups
    of one file are one ``read_row_groups`` call (one chunk per column, so
    batches inside it are views)."""
    out: list[tuple[str, int, int]] = []
    for path, lo, hi in pieces:
        if out and out[-1][0] == path and out[-1][2] == lo:
            out[-1] = (path, out[-1][1], hi)
        else:
            out.append((path, lo, hi))
    return out


def _new_counters() -> dict:
    return {"rows_decoded": 0, "rows_decoded_peak": 0, "host_copies": 0, "host_copy_bytes": 0}


#: This process's row-group decoding threads: ``(pid, ThreadPoolExecutor)``
#: (see :func:`_decoder`).
_decode: tuple[int, Any] | None = None
_decode_lock = threading.Lock()


def _decoder() -> Any:
    """Threads that decode row groups, one per core Arrow counts; made on first
    use, and again in a forked child (which inherits the pool, not its threads)."""
    global _decode
    from concurrent.futures import ThreadPoolExecutor

    with _decode_lock:
        if _decode is None or _decode[0] != os.getpid():
            pool = ThreadPoolExecutor(max(2, pa.cpu_count()), thread_name_prefix="slicefeed-decode")
            _decode = (os.getpid(), pool)
        return _decode[1]


def _native_path(fs: Any, path: str) -> str | None:
    """``path`` as an operating-system path when ``fs`` is exactly fsspec's local
    disk (a subclass may intercept reads, so it keeps its own ``open``)."""
    from fsspec.implementations.local import LocalFileSystem

    return fs._strip_protocol(path) if type(fs) is LocalFileSystem else None


def _read_group(source: Callable[[], Any], md: Any, g: int, columns: list[str]) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.ParquetFile(source(), metadata=md).read_row_group(g, columns=columns)


def _read_groups(pf: Any, idx: list[int], columns: list[str],
                 source: Callable[[], Any] | None, batch_rows: int) -> pa.Table:
    """Whole row groups ``idx`` of ``pf``, in file order. With ``source`` (gives
    a file of the same bytes that one thread may read: the Arrow ``OSFile`` of
    a local shard, whose positional reads are safe from several threads, or a
    twin of an object-storage shard's held ranges), each row group is decoded
    on a decoding thread (:func:`_decoder`): ``read_row_groups`` decodes a
    window's columns in parallel, and one column usually dominates, so a window
    would use about one core; and it grows one buffer per column to the
    window's size, where a chunk per row group is allocated once.

    The table then has a chunk per row group, so a batch of ``batch_rows`` that
    spans two is joined (one copy per column, counted where it is converted).
    Row groups are decoded concurrently only when at most a quarter of their
    boundaries fall inside a batch (counted from the first row group; the
    windows of a committed dataset start on a batch), so small row groups that
    batches straddle keep ``read_row_groups``, which decodes into one chunk."""
    if source is None or len(idx) < 2:
        return pf.read_row_groups(idx, columns=columns)
    md = pf.metadata
    ends = itertools.accumulate(md.row_group(g).num_rows for g in idx[:-1])
    if 4 * sum(1 for e in ends if e % batch_rows) > len(idx):
        return pf.read_row_groups(idx, columns=columns)
    pool = _decoder()
    futures = [pool.submit(_read_group, source, md, g, columns) for g in idx]
    try:
        return pa.concat_tables([f.result() for f in futures])
    finally:
        for f in futures:
            f.cancel()


def shard_schema(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    """The schema every table :func:`read_run` delivers: the manifest's fields
    of ``columns``, in that order, all nullable (a shard may declare a column
    ``not null`` and another not; the values are what the loader delivers, and
    a null among them is refused where it is converted)."""
    return pa.schema([schema.field(c).with_nullable(True) for c in columns])


def _marker(field: pa.Field) -> str:
    """``field``'s type for a message, saying whether it holds bfloat16 bits."""
    from slicefeed.connectors import printable
    from slicefeed.transforms import is_bfloat16_field

    t = printable(str(field.type), 200)
    if not is_bfloat16_field(field):
        return f"plain {t}"
    if field.type == pa.uint16():
        return "bfloat16 bits (slicefeed.dtype metadata)"
    return f"bfloat16 bits in {t} (slicefeed.dtype metadata)"


def check_shard(have: pa.Schema, want: pa.Schema, path: str, version: int | None) -> None:
    """A shard's own schema (``have``, from its footer) holds every field of
    ``want`` (:func:`shard_schema`) with the same type and bfloat16 marker;
    nullability may differ. Checked once per shard a run opens, before any of
    its rows meet another shard's: Arrow concatenates tables under the first
    one's field metadata, so a shard without the marker would be read as
    bfloat16, and tables of two types not at all.

    Raises:
        MissingColumnError: a column of ``want`` is not in the shard.
        SpecError: a column of another type or marker, or written twice.
    """
    from slicefeed.connectors import MissingColumnError, printable
    from slicefeed.transforms import is_bfloat16_field

    where = f"shard {printable(path, 300)!r}"
    manifest = "the dataset's manifest" + (f" (version {version})" if version is not None else "")
    redo = ("the shard was modified or replaced after the commit (every shard is committed with "
            "the manifest's schema); rewrite the dataset with --overwrite")
    for field in want:
        name = printable(field.name, 100)
        found = have.get_all_field_indices(field.name)
        if not found:
            raise MissingColumnError(
                f"JaxLoader: column {name!r} is missing from {where}, though {manifest} lists "
                f"it: {redo}, or leave the column out with exclude=[{name!r}].")
        if len(found) > 1:
            raise SpecError(
                f"JaxLoader: column {name!r} appears {len(found)} times in {where}, once in "
                f"{manifest}: {redo}.")
        theirs = have.field(found[0])
        if is_bfloat16_field(theirs) != is_bfloat16_field(field):
            raise SpecError(
                f"JaxLoader: column {name!r} is {_marker(theirs)} in {where}, but "
                f"{_marker(field)} in {manifest}: reading one as the other would change every "
                f"value; {redo}.")
        if theirs.type != field.type:
            raise SpecError(
                f"JaxLoader: column {name!r} is {printable(str(theirs.type), 200)} in {where}, "
                f"but {printable(str(field.type), 200)} in {manifest}: reading it as the "
                f"manifest's type could change its values; {redo}.")


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``, read from a shard :func:`check_shard` passed, under ``schema``
    (its columns in that order, the manifest's nullability and field metadata),
    so that tables of different shards concatenate (zero-copy: the same arrays)."""
    if table.column_names != schema.names:
        table = table.select(schema.names)
    if table.schema.equals(schema):
        return table
    # from_arrays does not compare types: check_shard did, for every column.
    return pa.Table.from_arrays(table.columns, schema=schema)


def read_run(batch: dict, *, fs, base_dir: str, columns: list[str], version: int | None = None,
             schema: pa.Schema | None = None, report: Any = None, concurrent_batch_rows: int = 0) -> Iterator[pa.Table]:
    """Reads one run of windows (see :func:`_plan.read_runs`), one table per
    window; also the Ray Data ``map_batches`` function of ``reader="ray"``.
    A window is ``{"pieces", "rng", "skip", "key"}`` and optionally ``"stop"``:
    it delivers rows ``[skip, stop)`` of its (permuted, if shuffling) rows.

    Whole row groups are read with ``read_row_groups``; a piece that is part of
    a row group, and the chunks of a row group larger than a window, are
    streamed (:class:`_Stream`), so a run decodes each row it reads once.
    Counters go to ``report`` when given, else into each table's schema
    metadata under :data:`READ_COUNTERS_KEY` (a Ray task has no other way back).
    ``concurrent_batch_rows``: the loader's local batch rows, to decode the
    consecutive whole row groups of a window concurrently (:func:`_read_groups`;
    local files are then opened as Arrow ``OSFile`` s); 0 (off) in a Ray task,
    which holds one CPU. A shard that is gone raises the error naming what
    removes such files (:func:`._shards.gone`; ``version``: the manifest's).
    ``schema`` (:func:`shard_schema`): every shard is checked against it when
    opened (:func:`check_shard`) and its tables delivered under it, so a
    window's tables from several shards concatenate; ``None``: unchecked.
    """
    assert len(batch["w"]) == 1
    spec = json.loads(batch["spec"][0])
    expect = spec.get("expect") or {}
    wins = spec["windows"]
    opened: dict[str, Any] = {}
    sources: dict[str, Callable[[], Any]] = {}  # path -> a file per decoding thread
    handles = []
    stream: _Stream | None = None
    batch_rows = max(sum(hi - lo for _, lo, hi in w["pieces"]) for w in wins)
    counters = _new_counters()
    try:
        def shard(path: str) -> Any:
            try:
                return opened[path] if path in opened else open_(path)
            except FileNotFoundError:
                raise _shards.gone(f"{base_dir}/{path}", version) from None

        def open_(path: str) -> Any:
            if expect.get(path) is not None and _shards.is_remote(fs):
                # Object storage: no stat, the run's column chunks in concurrent reads.
                opened[path], twin = _shards.open_shard(
                    fs, f"{base_dir}/{path}", expect[path], _shards.run_spans(wins, path),
                    columns)
                if concurrent_batch_rows:
                    sources[path] = twin
            else:
                native = _native_path(fs, f"{base_dir}/{path}") if concurrent_batch_rows else None
                f = fs.open(f"{base_dir}/{path}", "rb") if native is None else pa.OSFile(native)
                handles.append(f)
                opened[path] = _open_shard(f, f"{base_dir}/{path}", expect.get(path))
                if native is not None:
                    sources[path] = lambda f=f: f  # positional reads: one file for all
            if schema is not None:
                check_shard(opened[path].schema_arrow, schema, f"{base_dir}/{path}", version)
            return opened[path]

        def conform(t: pa.Table) -> pa.Table:
            return t if schema is None else _conformed(t, schema)

        if len(wins) > 1:  # the chunks of one piece: one stream for all of them
            path = wins[0]["pieces"][0][0]
            stream = _Stream(shard(path), wins[0]["pieces"][0][1], wins[-1]["pieces"][-1][2],
                             columns, batch_rows, counters, conform)
        for w in wins:
            if stream is None:
                counters = _new_counters()
            parts = []
            for path, lo, hi in _coalesce(w["pieces"]):
                if stream is not None:
                    parts += stream.take(hi - lo)
                    continue
                pf = shard(path)
                idx, _, exact = _overlapping_groups(pf, lo, hi)
                if exact:
                    t = conform(_read_groups(pf, idx, columns, sources.get(path),
                                             concurrent_batch_rows))
                    counters["rows_decoded"] += t.num_rows
                    parts.append((t, 0, t.num_rows))
                else:
                    parts += _Stream(pf, lo, hi, columns, hi - lo, counters,
                                     conform).take(hi - lo)
            table = _window_table(parts, spec["shuffle"], w["rng"], w["skip"], w.get("stop"),
                                  counters)
            del parts
            if report is not None:
                report(counters)
            else:
                md = dict(table.schema.metadata or {})
                md[READ_COUNTERS_KEY] = json.dumps({"key": w["key"], **counters}).encode()
                table = table.replace_schema_metadata(md)
            if stream is not None:
                counters = _new_counters()  # the next chunk's own counts
                stream._counters = counters
            yield table
    finally:
        for f in handles:
            f.close()


class _LocalRuns:
    """Reads a host's runs in this process with :func:`read_run` (the function
    ``reader="ray"`` maps over the runs, so the same rows in the same order),
    each on a thread that hands its windows over through a one-table queue;
    tables come out in order. At most ``read_ahead`` runs are pending at once,
    and a run stops pending as soon as its last window is handed over (as a
    window read ahead used to). pyarrow decodes without the GIL, so the
    threads overlap decoding with conversion and transfer. Memory: about
    ``2 * read_ahead + 1`` windows of decoded rows at most, also while the
    next epoch's runs take the places of this one's finished readers
    (``on_spare_reader``, which ``start(runs)`` serves: one run per free reader).

    On object storage the bytes of the next runs are fetched further ahead
    (:class:`._shards.FetchAhead`), so a store's first-byte delay overlaps
    decoding: :data:`FETCH_AHEAD` runs beyond those being read, one more each
    time the consumer has to wait, up to :data:`FETCH_AHEAD_MAX` (compressed
    bytes, held until their run reads them).
    """

    def __init__(self, items: list[dict], fn_kwargs: dict, read_ahead: int, stop,
                 on_spare_reader: Callable[[], None] | None = None):
        self.items = items
        self.fn_kwargs = fn_kwargs
        self.stop = stop
        self.on_spare_reader = on_spare_reader
        self.read_ahead = max(1, int(read_ahead))
        #: Runs fetched beyond those being read (object storage only).
        self.fetch_depth = FETCH_AHEAD
        self._closed = threading.Event()
        self._pool = None
        self._ahead = None
        self._fetch_to = None
        self._pending: list[list] = []  # [queue, windows still to hand over], in order
        self._next = 0  # the next run to submit

    def start(self, runs: int | None = None) -> None:
        """Starts reading before the first window is asked for: ``runs`` runs
        at first (default and at most ``read_ahead``); the first iteration
        starts the rest."""
        from concurrent.futures import ThreadPoolExecutor

        if self._closed.is_set():
            return
        if self._pool is None:
            self._ahead, self._fetch_to = self._fetcher()
            self._pool = ThreadPoolExecutor(self.read_ahead, thread_name_prefix="slicefeed-read")
        n = self.read_ahead if runs is None else min(runs, self.read_ahead)
        # Bytes fetched ahead: of the runs started and fetch_depth more (an early
        # start takes a previous epoch's reader: together within the same bound).
        self._fetch_to(n + self.fetch_depth)
        while self._next < min(n, len(self.items)):
            self._submit()

    def _submit(self) -> None:
        import queue

        q: queue.Queue = queue.Queue(maxsize=1)
        self._pool.submit(self._run, self.items[self._next], q, self._closed)
        self._pending.append([q, self.items[self._next]["n"]])
        self._next += 1

    def close(self) -> None:
        """Stops the readers and frees what they hold; idempotent."""
        self._closed.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _fetcher(self):
        """Fetches the bytes of runs ``[fetched, n)`` ahead, on object storage."""
        fs, base = self.fn_kwargs["fs"], self.fn_kwargs["base_dir"]
        columns = self.fn_kwargs["columns"]
        if not _shards.is_remote(fs):
            return None, lambda n: None
        ahead = _shards.FetchAhead(4 * FETCH_AHEAD_MAX)
        fetched = 0

        def fetch_to(n: int) -> None:
            nonlocal fetched
            while fetched < min(n, len(self.items)):
                spec = json.loads(self.items[fetched]["spec"])
                for path, exp in (spec.get("expect") or {}).items():
                    ahead.submit(fs, f"{base}/{path}", int(exp[1]),
                                 _shards.run_spans(spec["windows"], path), columns)
                fetched += 1

        return ahead, fetch_to

    def _run(self, item: dict, q, closed) -> None:
        import queue

        def put(x) -> bool:
            while not (closed.is_set() or self.stop.is_set()):
                try:
                    q.put(x, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            n = 0
            for table in read_run({"w": [item["w"]], "spec": [item["spec"]]}, **self.fn_kwargs):
                n += 1
                if not put(table):
                    return
            if n != item["n"]:  # pragma: no cover - read_run yields one table per window
                put(RuntimeError(f"read run {item['w']}: {n} windows read, {item['n']} planned"))
        except Exception as e:  # noqa: BLE001 - re-raised in the consumer, in order
            put(e)

    def __iter__(self) -> Iterator[pa.Table]:
        import queue

        try:
            self.start()
            pending = self._pending
            while pending:
                head = pending[0]
                x = None
                while x is None:
                    try:
                        x = head[0].get(timeout=0.1)
                    except queue.Empty:
                        if self.stop.is_set() or self._closed.is_set():
                            return
                        if self._ahead is not None:  # the consumer waits: fetch further ahead
                            self.fetch_depth = min(self.fetch_depth + 1, FETCH_AHEAD_MAX)
                if isinstance(x, BaseException):
                    raise x
                head[1] -= 1
                if head[1] == 0:
                    pending.pop(0)
                    if self._next < len(self.items) and not self.stop.is_set():
                        self._submit()
                        self._fetch_to(self._next + self.fetch_depth)
                    elif self.on_spare_reader is not None:
                        self.on_spare_reader()  # a reader of this epoch has nothing left
                yield x
        finally:
            self.close()


class _EpochTables:
    """An epoch's tables of ``batch_rows`` rows read by :class:`_LocalRuns`;
    ``start(runs)`` begins reading before the first table is asked for."""

    def __init__(self, runs: _LocalRuns, batch_rows: int):
        self._runs = runs
        self._tables = _batches_of(iter(runs), batch_rows)

    def start(self, runs: int | None = None) -> None:
        self._runs.start(runs)

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        return next(self._tables)

    def close(self) -> None:
        self._tables.close()
        self._runs.close()  # also when never iterated


#: Runs whose bytes are fetched beyond those being read, on object storage (see
#: :class:`_LocalRuns`); a run is one window (~32 MB decoded) or the chunks of
#: one large row group.
FETCH_AHEAD = 1
FETCH_AHEAD_MAX = 4


def read_ahead_bytes_max(src: Any, ctx: ReadContext, row_bytes: int) -> int:
    """Bytes the reader may hold ahead of the consumer: decoded windows (``2 *
    read_ahead + 1`` of ``window_rows`` rows for ``reader="local"``, see
    :class:`_LocalRuns`; ``ray_prefetch_batches + 1`` blocks otherwise) plus,
    for a committed dataset on object storage, the compressed bytes of the
    runs being read and fetched ahead (``read_ahead + FETCH_AHEAD_MAX`` runs of
    one window each, at the manifest's bytes per row)."""
    window = ctx.window_rows * row_bytes
    if not (isinstance(src, ManifestSource) and ctx.reader == "local"):
        return (ctx.ray_prefetch_batches + 1) * window
    held = (2 * ctx.read_ahead + 1) * window
    if _shards.is_remote(src.resolved.fs):
        held += (ctx.read_ahead + FETCH_AHEAD_MAX) * int(ctx.window_rows * src.bytes_per_row)
    return held


def _ray_read_tables(ds: Any, ctx: ReadContext) -> Iterator[pa.Table]:
    """Blocks of a ``reader="ray"`` read, as produced (one per window), with the
    read tasks' counters taken from their metadata; each block was put once in
    Ray's object store, a copy of every column."""
    import ray.exceptions

    from slicefeed.connectors import SlicefeedError
    from slicefeed.connectors._errors import task_error_cause

    seen: set[str] = set()
    blocks = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                  prefetch_batches=ctx.ray_prefetch_batches))
    while True:
        try:
            t = next(blocks)
        except StopIteration:
            return
        except ray.exceptions.RayTaskError as e:
            # A read task's named error (a shard gone, replaced or corrupt) leads
            # the message instead of Ray's traceback of the task.
            cause = task_error_cause(e)
            if isinstance(cause, SlicefeedError):
                raise cause from None
            raise
        md = dict(t.schema.metadata or {})
        raw = md.pop(READ_COUNTERS_KEY, None)
        t = t.replace_schema_metadata(md or None)
        if ctx.on_read is not None:
            counts = {"host_copies": t.num_columns, "host_copy_bytes": t.nbytes}
            if raw is not None:
                c = json.loads(raw)
                key = c.pop("key")
                if key not in seen:  # a block Ray split carries them twice
                    seen.add(key)
                    for k, v in c.items():
                        counts[k] = counts.get(k, 0) + v
            ctx.on_read(counts)
        yield t


class ManifestSource:
    """A committed dataset (its manifest): shares and windows planned from the
    manifest's row counts and row groups, no file opened before reading."""

    kind = "manifest"

    def __init__(self, uri: str, fs_kwargs: Mapping[str, Any], version: int | None = None):
        from slicefeed.connectors import read_manifest, resolve_filesystem

        self.uri = uri
        self.manifest = read_manifest(uri, version=version, **fs_kwargs)
        self.resolved = resolve_filesystem(uri, **fs_kwargs)
        #: The version this loader reads for its whole life (an overwrite keeps its files).
        self.version = self.manifest.version
        self.files = [(f.path, int(f.num_rows)) for f in self.manifest.files]
        self.units = _plan.read_units(
            [(f.path, int(f.num_rows), tuple(f.row_groups)) for f in self.manifest.files])
        self.expect = {f.path: [int(f.num_rows), int(f.num_bytes)] for f in self.manifest.files}
        self.num_rows = sum(n for _, n in self.files)
        nbytes = sum(int(f.num_bytes) for f in self.manifest.files)
        self.bytes_per_row = nbytes / max(self.num_rows, 1)
        self._process: tuple[int, int] = (0, 1)

    def schema(self) -> pa.Schema:
        return self.manifest.schema

    def fingerprint(self) -> dict:
        h = hashlib.sha256(json.dumps(self.files).encode()).hexdigest()[:16]
        return {"source": self.kind, "dataset_version": self.version, "num_rows": self.num_rows,
                "files": h}

    def share_sizes(self, process_count: int) -> list[int]:
        return [b - a for a, b in _plan.host_shares(self.num_rows, process_count)]

    def local_rows(self) -> int | None:
        return None  # known through share_sizes

    def share(self, epoch: int, ctx: ReadContext) -> list[_plan.Piece]:
        order = _plan.epoch_unit_order(len(self.units), ctx.seed, epoch, ctx.shuffle)
        start, stop = _plan.host_shares(self.num_rows, ctx.process_count)[ctx.process_index]
        if ctx.limit_rows is not None:
            stop = min(stop, start + ctx.limit_rows)
        return _plan.pieces(self.units, order, start, stop)

    def tables(self, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
        if ctx.spans is not None:
            return self._span_tables(ctx.spans, epoch, skip_rows, ctx)
        # The plan below is mirrored by _plan.host_spans (elastic resume): change both.
        share = self.share(epoch, ctx)
        windows = _plan.windows(share, ctx.window_rows)
        first, skip = _plan.find_window(windows, skip_rows)
        items = []
        for k0, k1 in _plan.read_runs(share, ctx.window_rows):
            if k1 <= first:
                continue
            wins = []
            for k in range(max(k0, first), k1):
                w = {"pieces": windows[k], "key": f"{epoch}/{k}", "skip": 0,
                     "rng": _plan.window_rng(ctx.seed, epoch, ctx.process_index, k)}
                if k == first and skip:
                    if ctx.shuffle:
                        w["skip"] = skip  # read the window, permute, then drop the prefix
                    else:  # no permutation: start reading at the resume row
                        w["pieces"] = _plan.skip_pieces(windows[k], skip)
                wins.append(w)
            spec = {"windows": wins, "shuffle": ctx.shuffle,
                    "expect": {p: self.expect[p] for w in wins for p, _, _ in w["pieces"]}}
            items.append({"w": k0, "n": len(wins), "spec": json.dumps(spec)})
        return self._read_items(items, ctx)

    def _span_tables(self, spans, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
        """A resumed epoch's spans from row ``skip_rows``: a shuffled span reads
        its whole window and delivers rows ``[lo, hi)`` of its permutation; an
        unshuffled one reads only its rows."""
        runs: list[list[dict]] = []
        prev = None
        for k, s in enumerate(_plan.cut_spans(spans, skip_rows, _plan.spans_rows(spans))):
            w = {"pieces": s.pieces, "key": f"{epoch}/s{k}", "skip": s.lo, "stop": s.hi,
                 "rng": list(s.rng) if s.rng is not None else None}
            # Spans that continue one piece (the chunks of a row group larger than
            # a window) are one run: one stream, so nothing is decoded twice.
            one = s.pieces[0] if len(s.pieces) == 1 else None
            if (runs and one is not None and prev is not None and prev[0] == one[0]
                    and prev[2] == one[1] and (s.rng is None) == (runs[-1][0]["rng"] is None)):
                runs[-1].append(w)
            else:
                runs.append([w])
            prev = one
        items = []
        for k, wins in enumerate(runs):
            spec = {"windows": wins, "shuffle": wins[0]["rng"] is not None,
                    "expect": {p: self.expect[p] for w in wins for p, _, _ in w["pieces"]}}
            items.append({"w": k, "n": len(wins), "spec": json.dumps(spec)})
        return self._read_items(items, ctx)

    def _read_items(self, items: list[dict], ctx: ReadContext) -> Iterator[pa.Table]:
        """Tables of ``ctx.batch_rows`` rows from runs of window specs, read in order."""
        if not items:
            return iter(())
        fn_kwargs = {
            "fs": self.resolved.fs,
            "base_dir": self.resolved.path.rstrip("/"),
            "columns": list(ctx.columns),
            "version": self.version,
            "schema": shard_schema(self.manifest.schema, list(ctx.columns)),
        }
        if ctx.reader == "local":
            local = {**fn_kwargs, "report": ctx.on_read, "concurrent_batch_rows": ctx.batch_rows}
            runs = _LocalRuns(items, local, ctx.read_ahead, ctx.stop, ctx.on_spare_reader)
            return _EpochTables(runs, ctx.batch_rows)
        import ray.data

        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = _compat.dataset_preserving_order(ds)
        ds = ds.map_batches(read_run, batch_size=1, batch_format="numpy", fn_kwargs=fn_kwargs)
        ds = _compat.dataset_preserving_order(ds)
        return _batches_of(_ray_read_tables(ds, ctx), ctx.batch_rows)

    def locate(self, epoch: int, row: int, ctx: ReadContext) -> str:
        if ctx.spans is not None:
            path, file_row, _ = _plan.locate_span(ctx.spans, row)
            return f"file {path!r} row {file_row}"

        def rng_of(k: int) -> list[int]:
            return _plan.window_rng(ctx.seed, epoch, ctx.process_index, k)

        path, file_row, _ = _plan.locate(self.share(epoch, ctx), ctx.window_rows, row,
                                         rng_of if ctx.shuffle else None)
        return f"file {path!r} row {file_row}"


def _refuse_shared(what: str, process_count: int) -> SpecError:
    return SpecError(
        f"JaxLoader: {what} on {process_count} JAX processes: every process would execute "
        "all of it and deliver every row once per process. Pass the URI of a committed "
        "dataset or a slicefeed Pipeline (both are split across hosts), or inside Ray Train "
        "ray.train.get_dataset_shard(...); if this Dataset already holds only this host's "
        "own rows, say so with host_local=True."
    )


def make_source(
    source: Any,
    fs_kwargs: Mapping[str, Any],
    *,
    process_index: int = 0,
    process_count: int = 1,
    host_local: bool = False,
    first_read: tuple[int, int] | None = None,
    version: int | None = None,
) -> Source:
    """The :class:`Source` for what the user passed.

    With more than one process, a slicefeed ``Pipeline`` is split by input
    files (host ``i`` of ``n`` reads files ``i::n``); a ``ray.data.Dataset`` is
    refused unless ``host_local`` says it is this host's own data.
    ``first_read``: see :class:`RaySource` (``None`` for a shuffled read).

    ``version`` opens that version of a committed dataset (a resumed state's).

    Raises:
        SpecError: an unsupported source, a ``.dataset()`` that returns no
            Dataset, or a Dataset shared by several processes.
    """
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        return ManifestSource(str(source), fs_kwargs, version)
    import ray.data

    shared = process_count > 1 and not host_local
    if isinstance(source, ray.data.Dataset):
        if shared:
            raise _refuse_shared("a ray.data.Dataset", process_count)
        return RaySource(source, "dataset")
    if isinstance(source, ray.data.DataIterator):
        return RaySource(source, "iterator", first_read=first_read)
    if callable(getattr(source, "dataset", None)):
        # A slicefeed Pipeline knows its output schema without running
        # (``check()``, what ``slicefeed validate`` computes): asking the Dataset
        # instead would execute the pipeline once more than the epochs need.
        from slicefeed.pipelines._pipeline import Pipeline  # only for pipeline sources

        check = getattr(source, "check", None)
        schema = check() if callable(check) else None
        if isinstance(source, Pipeline) and shared:
            ds = source.dataset(shard=(process_index, process_count))
        elif shared:
            raise _refuse_shared(f"{type(source).__name__}.dataset()", process_count)
        else:
            ds = source.dataset()
        if not isinstance(ds, ray.data.Dataset):
            raise SpecError(
                f"JaxLoader: {type(source).__name__}.dataset() returned "
                f"{type(ds).__name__}, expected a ray.data.Dataset."
            )
        return RaySource(ds, "dataset", schema if isinstance(schema, pa.Schema) else None)
    raise SpecError(
        f"JaxLoader: unsupported source {type(source).__name__}; pass a ray.data.Dataset, "
        "a ray.data.DataIterator (ray.train.get_dataset_shard), a pipeline with "
        ".dataset(), or the URI of a committed dataset."
    )
