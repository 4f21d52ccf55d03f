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
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from slicefeed.connectors import SpecError, _compat
from slicefeed.pipelines._loader import _plan


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
            return _skip_batches(primed, skip_rows // ctx.batch_rows)
        return _ray_tables(self.obj, epoch, skip_rows, ctx)

    def locate(self, epoch: int, row: int, ctx: ReadContext) -> str:
        return f"row {row} of this host's epoch {epoch} (the source has no file positions)"


def _skip_batches(tables: Iterator[pa.Table], n: int) -> Iterator[pa.Table]:
    """``tables`` without its first ``n`` (no row positions: read and discard)."""
    for table in tables:
        if n:
            n -= 1
            continue
        yield table


def _ray_tables(obj: Any, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
    """Arrow tables of ``ctx.batch_rows`` rows from a Dataset / DataIterator (any block
    format: Ray converts pandas blocks), with Ray's seeded local shuffle if asked."""
    shuffle = ctx.shuffle
    it = obj.iter_batches(
        batch_size=ctx.batch_rows,
        batch_format="pyarrow",
        prefetch_batches=ctx.ray_prefetch_batches,
        drop_last=False,
        local_shuffle_buffer_size=ctx.shuffle_buffer_rows if shuffle else None,
        local_shuffle_seed=(ctx.seed * 1_000_003 + epoch) % (2**32) if shuffle else None,
    )
    yield from _skip_batches(iter(it), skip_rows // ctx.batch_rows)


# --------------------------------------------------------------------------- committed


def _open_shard(f: Any, path: str, expect: list[int] | None) -> Any:
    """A ``ParquetFile`` of a committed shard, checked against the manifest's
    ``[num_rows, num_bytes]`` when given (a replaced or truncated shard would
    give hosts different step counts)."""
    import pyarrow.parquet as pq

    from slicefeed.connectors import CorruptFileError, ShardMismatchError

    size = getattr(f, "size", None)
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


def read_window(batch: dict, *, fs, base_dir: str, columns: list[str]) -> pa.Table:
    """Reads one window (only the row groups it overlaps); also a Ray Data map_batches fn."""
    assert len(batch["w"]) == 1
    spec = json.loads(batch["spec"][0])
    expect = spec.get("expect") or {}
    tables, positions, base = [], [], 0
    for path, lo, hi in spec["pieces"]:
        with fs.open(f"{base_dir}/{path}", "rb") as f:
            pf = _open_shard(f, f"{base_dir}/{path}", expect.get(path))
            md = pf.metadata
            idx, first, pos = [], None, 0
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                if pos + n > lo and pos < hi:
                    idx.append(g)
                    first = pos if first is None else first
                pos += n
            t = pf.read_row_groups(idx, columns=columns)
        tables.append(t)
        positions.append(base + (lo - first) + np.arange(hi - lo))
        base += t.num_rows
    if not spec["shuffle"]:
        starts = np.cumsum([0] + [t.num_rows for t in tables[:-1]])
        table = pa.concat_tables(
            [t.slice(p[0] - b, len(p)) for t, p, b in zip(tables, positions, starts)]
        )
        return table.slice(spec["skip"]) if spec["skip"] else table
    order = np.concatenate(positions)
    order = order[_plan.window_permutation(spec["rng"], len(order))]
    order = order[spec["skip"]:]
    # take() on the unsliced tables: pyarrow 26's take on a *sliced* nested
    # fixed_size_list array returns wrong rows (tests/pipelines/test_loader.py::
    # test_pyarrow_nested_fsl_take_bug documents it); offsets 0 are safe.
    return pa.concat_tables(tables).take(pa.array(order))


class _LocalWindows:
    """Reads a host's windows in this process: :func:`read_window` (the function
    ``reader="ray"`` maps over the windows, so the same rows in the same order) on
    a few threads, in order, at most ``read_ahead`` windows ahead. pyarrow decodes
    without the GIL, so the threads overlap decoding with conversion and transfer.
    """

    def __init__(self, items: list[dict], fn_kwargs: dict, read_ahead: int, stop):
        self.items = items
        self.fn_kwargs = fn_kwargs
        self.stop = stop
        self.read_ahead = max(1, int(read_ahead))

    def _read(self, item: dict) -> pa.Table:
        return read_window({"w": [item["w"]], "spec": [item["spec"]]}, **self.fn_kwargs)

    def __iter__(self) -> Iterator[pa.Table]:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(self.read_ahead, thread_name_prefix="slicefeed-read")
        try:
            pending = [pool.submit(self._read, it) for it in self.items[: self.read_ahead]]
            nxt = len(pending)
            while pending:
                table = pending.pop(0).result()
                if nxt < len(self.items) and not self.stop.is_set():
                    pending.append(pool.submit(self._read, self.items[nxt]))
                    nxt += 1
                yield table
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


class ManifestSource:
    """A committed dataset (its manifest): shares and windows planned from file sizes."""

    kind = "manifest"

    def __init__(self, uri: str, fs_kwargs: Mapping[str, Any]):
        from slicefeed.connectors import read_manifest, resolve_filesystem

        self.uri = uri
        self.manifest = read_manifest(uri, **fs_kwargs)
        self.resolved = resolve_filesystem(uri, **fs_kwargs)
        #: The version this loader reads for its whole life (an overwrite keeps its files).
        self.version = self.manifest.version
        self.files = [(f.path, int(f.num_rows)) for f in self.manifest.files]
        self.expect = {f.path: [int(f.num_rows), int(f.num_bytes)] for f in self.manifest.files}
        self.num_rows = sum(n for _, n in self.files)
        nbytes = sum(int(f.num_bytes) for f in self.manifest.files)
        self.bytes_per_row = nbytes / max(self.num_rows, 1)
        self._process: tuple[int, int] = (0, 1)

    def schema(self) -> pa.Schema:
        return self.manifest.schema

    def fingerprint(self) -> dict:
        h = hashlib.sha256(json.dumps(self.files).encode()).hexdigest()[:16]
        return {"source": self.kind, "num_rows": self.num_rows, "files": h}

    def share_sizes(self, process_count: int) -> list[int]:
        return [b - a for a, b in _plan.host_shares(self.num_rows, process_count)]

    def local_rows(self) -> int | None:
        return None  # known through share_sizes

    def share(self, epoch: int, ctx: ReadContext) -> list[_plan.Piece]:
        order = _plan.epoch_file_order(len(self.files), ctx.seed, epoch, ctx.shuffle)
        start, stop = _plan.host_shares(self.num_rows, ctx.process_count)[ctx.process_index]
        if ctx.limit_rows is not None:
            stop = min(stop, start + ctx.limit_rows)
        return _plan.pieces(self.files, order, start, stop)

    def tables(self, epoch: int, skip_rows: int, ctx: ReadContext) -> Iterator[pa.Table]:
        windows = _plan.windows(self.share(epoch, ctx), ctx.window_rows)
        first = skip_rows // ctx.window_rows
        skip = skip_rows - first * ctx.window_rows
        items = []
        for k in range(first, len(windows)):
            spec = {
                "pieces": windows[k],
                "shuffle": ctx.shuffle,
                "rng": _plan.window_rng(ctx.seed, epoch, ctx.process_index, k),
                "skip": 0,
            }
            if k == first and skip:
                if ctx.shuffle:
                    spec["skip"] = skip  # read the window, permute, then drop the prefix
                else:  # no permutation: start reading at the resume row
                    spec["pieces"] = _plan.skip_pieces(windows[k], skip)
            spec["expect"] = {p: self.expect[p] for p, _, _ in spec["pieces"]}
            items.append({"w": k, "spec": json.dumps(spec)})
        if not items:
            return iter(())
        fn_kwargs = {
            "fs": self.resolved.fs,
            "base_dir": self.resolved.path.rstrip("/"),
            "columns": list(ctx.columns),
        }
        if ctx.reader == "local":
            return _batches_of(
                iter(_LocalWindows(items, fn_kwargs, ctx.read_ahead, ctx.stop)), ctx.batch_rows
            )
        import ray.data

        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = _compat.dataset_preserving_order(ds)
        ds = ds.map_batches(read_window, batch_size=1, batch_format="numpy", fn_kwargs=fn_kwargs)
        ds = _compat.dataset_preserving_order(ds)
        return _ray_tables(ds, epoch, 0, dataclasses.replace(ctx, shuffle=False))

    def locate(self, epoch: int, row: int, ctx: ReadContext) -> str:
        k = row // ctx.window_rows
        rng = _plan.window_rng(ctx.seed, epoch, ctx.process_index, k) if ctx.shuffle else None
        path, file_row, _ = _plan.locate(self.share(epoch, ctx), ctx.window_rows, row, rng)
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
) -> Source:
    """The :class:`Source` for what the user passed.

    With more than one process, a slicefeed ``Pipeline`` is split by input
    files (host ``i`` of ``n`` reads files ``i::n``); a ``ray.data.Dataset`` is
    refused unless ``host_local`` says it is this host's own data.
    ``first_read``: see :class:`RaySource` (``None`` for a shuffled read).

    Raises:
        SpecError: an unsupported source, a ``.dataset()`` that returns no
            Dataset, or a Dataset shared by several processes.
    """
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        return ManifestSource(str(source), fs_kwargs)
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
