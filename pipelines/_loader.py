"""JaxLoader: static-shape, device-sharded, equal-step, resumable JAX batches.

See :class:`JaxLoader`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import queue
import threading
import time
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa

from slicefeed.connectors import SpecError
from slicefeed.connectors._compat import dataset_meta_count, jax_kv_client, jax_sharding_1d
from slicefeed.pipelines._columns import (
    MASK_KEY,
    ColumnSpec,
    convert_table,
    empty_batch,
    pad_batch,
    plan_columns,
)

try:  # Ray >= 2.5x
    from ray.data.collate_fn import ArrowBatchCollateFn
except ImportError:  # pragma: no cover
    ArrowBatchCollateFn = object  # type: ignore[misc,assignment]

_STATE_VERSION = 1
# Rows per read window of a committed dataset when not shuffling: ~32 MB of decoded
# rows per read (benchmarks/loader.py: 64 MB of *compressed* Parquet made the first
# window 4x larger, the time to first batch 30 s on 2 cores).
_WINDOW_TARGET_BYTES = 32 << 20
_KV_PREFIX = "slicefeed/jaxloader"
_loader_counter = itertools.count()


# --------------------------------------------------------------------------- plans


def _epoch_file_order(num_files: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_files)
    return np.random.default_rng([seed, epoch, 0x5F]).permutation(num_files)


def host_shares(num_rows: int, process_count: int) -> list[tuple[int, int]]:
    """Contiguous, balanced ``[start, stop)`` row ranges of each host (sizes differ by <= 1)."""
    return [
        (h * num_rows // process_count, (h + 1) * num_rows // process_count)
        for h in range(process_count)
    ]


def steps_for(share_sizes: list[int], local_batch_size: int, remainder: str) -> int:
    """Batches per epoch every host takes, given each host's rows for the epoch."""
    if remainder == "drop":
        return min(share_sizes) // local_batch_size
    return max(-(-s // local_batch_size) for s in share_sizes)


def _pieces(
    files: list[tuple[str, int]], order: np.ndarray, start: int, stop: int
) -> list[tuple[str, int, int]]:
    """Row range ``[start, stop)`` of the epoch's file stream as (path, lo, hi) pieces."""
    out = []
    pos = 0
    for i in order:
        path, n = files[i]
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            out.append((path, lo, hi))
        pos += n
        if pos >= stop:
            break
    return out


def _windows(pieces: list[tuple[str, int, int]], window_rows: int) -> list[list]:
    """Splits a host share (list of pieces) into consecutive windows of ``window_rows``."""
    windows: list[list] = []
    cur: list = []
    room = window_rows
    for path, lo, hi in pieces:
        while lo < hi:
            take = min(hi - lo, room)
            cur.append((path, lo, lo + take))
            lo += take
            room -= take
            if room == 0:
                windows.append(cur)
                cur, room = [], window_rows
    if cur:
        windows.append(cur)
    return windows


def _read_window(batch: dict, *, fs, base_dir: str, columns: list[str]) -> pa.Table:
    """Ray Data map_batches fn: reads one window (only the row groups it overlaps)."""
    import pyarrow.parquet as pq

    assert len(batch["w"]) == 1
    spec = json.loads(batch["spec"][0])
    tables, positions, base = [], [], 0
    for path, lo, hi in spec["pieces"]:
        with fs.open(f"{base_dir}/{path}", "rb") as f:
            pf = pq.ParquetFile(f)
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
        table = pa.concat_tables(
            [t.slice(p[0] - b, len(p)) for t, p, b in zip(tables, positions, _starts(tables))]
        )
        return table.slice(spec["skip"]) if spec["skip"] else table
    order = np.concatenate(positions)
    order = order[np.random.default_rng(spec["rng"]).permutation(len(order))]
    order = order[spec["skip"]:]
    # take() on the unsliced tables: pyarrow 26's take on a *sliced* nested
    # fixed_size_list array returns wrong rows (tests/pipelines/test_loader.py::
    # test_pyarrow_nested_fsl_take_bug documents it); offsets 0 are safe.
    return pa.concat_tables(tables).take(pa.array(order))


def _starts(tables: list[pa.Table]) -> list[int]:
    out, pos = [], 0
    for t in tables:
        out.append(pos)
        pos += t.num_rows
    return out


# --------------------------------------------------------------------------- sources


class _Source:
    kind = "?"
    local_rows_known: int | None = None  # rows of this host per epoch, if known w/o reading
    supports_skip = False  # can start an epoch at a row offset without reading the prefix

    def schema(self) -> pa.Schema:
        raise NotImplementedError

    def dataset_or_iterator(self, epoch: int, skip_rows: int, loader: "JaxLoader"):
        """(ds_or_iterator, rows_still_to_skip_by_reading)."""
        raise NotImplementedError

    def fingerprint(self) -> dict:
        return {"source": self.kind}


def _to_pa_schema(schema) -> pa.Schema:
    if schema is None:
        raise SpecError("JaxLoader: the source has no schema (is it empty?).")
    if isinstance(schema, pa.Schema):
        return schema
    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema):
        return base
    raise SpecError(
        f"JaxLoader: the source's schema is not Arrow ({type(schema).__name__}); "
        "convert the dataset to Arrow blocks (e.g. map_batches(..., batch_format='pyarrow'))."
    )


class _DatasetSource(_Source):
    kind = "dataset"

    def __init__(self, ds):
        import ray.data

        # A private copy whose execution preserves block order: determinism.
        ds = ray.data.Dataset.copy(ds)
        ds._context = ds.context.copy()  # copy() shares the context object
        ds.context.execution_options.preserve_order = True
        self.ds = ds
        self.local_rows_known = dataset_meta_count(ds)

    def schema(self):
        return _to_pa_schema(self.ds.schema())

    def dataset_or_iterator(self, epoch, skip_rows, loader):
        return self.ds, skip_rows


class _IteratorSource(_Source):
    kind = "iterator"

    def __init__(self, it):
        self.it = it

    def schema(self):
        return _to_pa_schema(self.it.schema())

    def dataset_or_iterator(self, epoch, skip_rows, loader):
        return self.it, skip_rows


class _ManifestSource(_Source):
    kind = "manifest"
    supports_skip = True

    def __init__(self, uri: str, fs_kwargs: Mapping[str, Any]):
        from slicefeed.connectors import read_manifest, resolve_filesystem

        self.uri = uri
        self.manifest = read_manifest(uri, **fs_kwargs)
        self.resolved = resolve_filesystem(uri, **fs_kwargs)
        self.files = [(f.path, int(f.num_rows)) for f in self.manifest.files]
        self.num_rows = sum(n for _, n in self.files)
        nbytes = sum(int(f.num_bytes) for f in self.manifest.files)
        self.bytes_per_row = nbytes / max(self.num_rows, 1)

    def schema(self):
        return self.manifest.schema

    def fingerprint(self):
        h = hashlib.sha256(json.dumps(self.files).encode()).hexdigest()[:16]
        return {"source": self.kind, "num_rows": self.num_rows, "files": h}

    def share(self, epoch: int, loader: "JaxLoader") -> list[tuple[str, int, int]]:
        order = _epoch_file_order(len(self.files), loader.seed, epoch, loader.shuffle)
        start, stop = host_shares(self.num_rows, loader.process_count)[loader.process_index]
        return _pieces(self.files, order, start, stop)

    def dataset_or_iterator(self, epoch, skip_rows, loader):
        import ray.data

        windows = _windows(self.share(epoch, loader), loader.window_rows)
        first = skip_rows // loader.window_rows
        skip = skip_rows - first * loader.window_rows
        items = []
        for k in range(first, len(windows)):
            pieces = windows[k]
            spec = {
                "pieces": pieces,
                "shuffle": loader.shuffle,
                "rng": [loader.seed, epoch, loader.process_index, k],
                "skip": 0,
            }
            if k == first and skip:
                if loader.shuffle:
                    spec["skip"] = skip  # read the window, permute, then drop the prefix
                else:  # no permutation: start reading at the resume row
                    spec["pieces"] = _skip_pieces(pieces, skip)
            items.append({"w": k, "spec": json.dumps(spec)})
        if not items:
            return None, 0
        fn_kwargs = {
            "fs": self.resolved.fs,
            "base_dir": self.resolved.path.rstrip("/"),
            "columns": loader._read_columns,
        }
        if loader.reader == "local":
            return _LocalWindows(items, fn_kwargs, loader), 0
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds._context = ds.context.copy()
        ds.context.execution_options.preserve_order = True
        ds = ds.map_batches(
            _read_window,
            batch_size=1,
            batch_format="numpy",
            fn_kwargs=fn_kwargs,
        )
        ds.context.execution_options.preserve_order = True
        return ds, 0


def _skip_pieces(pieces: list, skip: int) -> list:
    """``pieces`` without their first ``skip`` rows."""
    out = []
    for p, lo, hi in pieces:
        n = hi - lo
        if skip >= n:
            skip -= n
            continue
        out.append((p, lo + skip, hi))
        skip = 0
    return out


class _LocalWindows:
    """Reads a host's windows in this process: ``_read_window`` (the same function the
    Ray path maps over the windows, so the same rows in the same order) on a few
    threads, in order, at most ``lookahead`` windows ahead. pyarrow decodes without
    the GIL, so the threads overlap decoding with conversion and transfer.

    Compared with one Ray task per window (``reader="ray"``) this saves the copy
    into Ray's object store, worker start-up and scheduling; on a 2-core machine
    it also avoids competing with Ray's own processes (benchmarks/README.md).
    """

    def __init__(self, items: list[dict], fn_kwargs: dict, loader: "JaxLoader"):
        self.items = items
        self.fn_kwargs = fn_kwargs
        self.stop = loader._stop
        # 2 windows in flight: one being consumed, one decoding (benchmarks/loader.py).
        self.lookahead = max(1, int(loader.local_read_ahead))

    def _read(self, item: dict) -> pa.Table:
        return _read_window({"w": [item["w"]], "spec": [item["spec"]]}, **self.fn_kwargs)

    def tables(self) -> Iterator[pa.Table]:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(self.lookahead, thread_name_prefix="slicefeed-read")
        try:
            pending = [pool.submit(self._read, it) for it in self.items[: self.lookahead]]
            nxt = len(pending)
            while pending:
                table = pending.pop(0).result()
                if nxt < len(self.items) and not self.stop.is_set():
                    pending.append(pool.submit(self._read, self.items[nxt]))
                    nxt += 1
                yield table
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def batches(self, rows: int) -> Iterator[pa.Table]:
        """Tables of exactly ``rows`` rows (the last one may be shorter). Slices of
        a window are zero-copy; only a batch spanning two windows is chunked."""
        carry = None
        for t in self.tables():
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


# --------------------------------------------------------------------------- collate


class _Collate(ArrowBatchCollateFn):
    """Arrow batch -> padded NumPy batch (host casts included), run by Ray Data's threads."""

    def __init__(self, loader: "JaxLoader"):
        self.specs = loader._specs
        self.rows = loader.local_batch_size
        self.mask_key = loader.mask_key if loader.remainder == "pad" else None
        self.loader = loader
        self.partial_rows: int | None = None

    def __call__(self, table: pa.Table) -> dict[str, np.ndarray]:
        counter = [0]
        out = convert_table(self.specs, table, counter)
        n = table.num_rows
        if n < self.rows:
            self.partial_rows = n  # only the last batch of an epoch can be partial
            out = pad_batch(out, self.specs, self.rows)
            counter[0] += 1
        if self.mask_key:
            out[self.mask_key] = np.arange(self.rows) < n
        self.loader._count_copies(counter[0], n)
        return out


# --------------------------------------------------------------------------- loader


class JaxLoader:
    """Feeds a training loop with global, device-sharded, static-shape ``jax.Array`` batches.

    Each step yields ``dict[str, jax.Array]``: one global array per selected column
    with leading dimension ``global_batch_size``, built from this host's
    ``global_batch_size / jax.process_count()`` rows with
    ``jax.make_array_from_process_local_data``. Every step has the same keys,
    shapes and dtypes; every host takes the same number of steps per epoch.

    Example::

        loader = JaxLoader(ray.train.get_dataset_shard("train"), global_batch_size=1024)
        for batch in loader:
            state = train_step(state, batch)

    **Sources.** A ``ray.data.Dataset``; a ``ray.data.DataIterator`` (what
    ``ray.train.get_dataset_shard`` returns); a pipeline (anything with a
    ``.dataset()`` method); or the URI of a committed slicefeed dataset. With a
    URI every host reads a disjoint, contiguous, balanced share of the epoch's
    row stream (host ``i`` of ``n`` gets rows ``[i*N//n, (i+1)*N//n)`` of the
    files in epoch order), so across hosts each row is delivered once per epoch.

    **Sharding.** By default batches are sharded over a 1-D mesh of all devices
    (Ray Data's internal ``"data"`` mesh). Dataset / iterator sources are moved by
    Ray Data's ``iter_jax_batches``, fed by an Arrow ``collate_fn`` that converts,
    casts and pads on the host, so Ray's on-device ``astype`` and mask-less
    padding are never used. A committed-dataset URI is read by the loader itself
    (``reader="local"``, see below) and each batch is transferred with one
    ``make_array_from_process_local_data`` call for all its columns. With
    ``mesh=`` (and ``partition_spec=``, default ``PartitionSpec(mesh.axis_names)``)
    arrays are built directly with ``NamedSharding(mesh, spec)`` (the spec is
    truncated to each array's rank), so nothing is resharded on first use.

    **Columns.** Numeric scalars pass through as views; ``fixed_size_list``
    (nested too), Ray tensor and ``fixed_shape_tensor`` columns become dense
    ``(rows, d1, d2, ...)`` views of Arrow's values buffer; variable-length
    lists need ``pad_lengths={col: L}``; strings must be excluded. ``dtypes=``
    casts on the host before transfer (e.g. ``{"ids": "int32", "x": "bfloat16"}``).

    **Copies per delivered byte (fixed_size_list / tensor path).** Measured
    with ``stats()["host_copies"]`` and buffer-address checks
    (tests/pipelines/test_loader.py::test_copy_count_fixed_size_list): when a
    batch lies inside one Ray block, conversion makes **0** copies (a NumPy
    view of the Arrow values buffer); over a 48 MiB fixed_size_list<int32>[2048]
    file read with 256-row batches, ``host_copies`` was 0 for all 24 batches.
    A batch spanning blocks costs 1 concatenation; a ``dtypes`` cast is +1;
    padding the final partial batch is +1 (that batch only). Host->device is
    1 DMA on TPU/GPU; on the CPU backend ``make_array_from_process_local_data``
    aliases the host buffer (0 copies) when each device's slice is 64-byte
    aligned (Arrow allocates 64-byte-aligned buffers), else copies once. So:
    0 host copies + 1 transfer per delivered byte in the common case, at most
    2 host copies (concatenate + cast). Committed datasets read with
    ``shuffle=True`` pay one more copy (the window permutation, ``Table.take``).
    ``reader="ray"`` adds one more: the window's copy into Ray's object store
    (``reader="local"`` has none: Parquet decodes into Arrow buffers that the
    batches then view).

    **Remainder.** ``"drop"`` drops a partial last batch (``stats()["dropped_rows"]``);
    ``"pad"`` pads it and adds a boolean ``mask_key`` array (False on padding).

    **Equal steps.** When every host's row count is known from metadata (a
    committed dataset's manifest; a Dataset whose row count Ray knows without
    executing, e.g. Parquet footers), ``steps_per_epoch`` is fixed before the
    first batch: ``min(rows_h) // local`` for ``"drop"``, ``max(ceil(rows_h / local))``
    for ``"pad"`` (hosts with fewer rows get fully masked batches). A URI needs
    no communication; a Dataset exchanges its count once through the
    ``jax.distributed`` key-value store. When counts are unknown (a
    ``DataIterator``), each step's "full / partial / none" status is exchanged
    through that key-value store from the prefetch thread, with a timeout
    (``sync_timeout_s``), never a device collective, so it cannot hang forever
    or interleave with the user's collectives; hosts stop at the first step
    some host cannot fill (``"drop"``, the rest of the local shard is drained
    to count it) or when all are exhausted (``"pad"``). Loaders must be
    created in the same order on every host (their keys are numbered).

    **Shuffling and its cost.** ``shuffle=True`` for a committed dataset
    permutes the file order per epoch (``seed``, ``epoch``) and then each
    host's share in windows of ``shuffle_buffer_rows`` rows (rounded up to a
    multiple of the local batch size): memory is about one window per Ray read
    task in flight, and each row is copied once more (``Table.take``). Windows
    make resume exact: a restart reads at most one window it then discards.
    For Dataset / DataIterator sources ``shuffle=True`` uses Ray Data's local
    shuffle buffer (``local_shuffle_buffer_size=shuffle_buffer_rows``, seeded
    by ``(seed, epoch)``); its cost is one buffer of rows plus a copy per row,
    and file order is whatever the Dataset has (use ``read_parquet(...,
    shuffle=...)``). Ray Train's iterators are deterministic only with
    ``DataConfig(execution_options=...preserve_order=True)``.

    **Resume.** ``state_dict()`` is ``{"version", "epoch", "step", "seed",
    "plan"}`` for the next batch the consumer will receive (batches prefetched
    but not yet received are not counted). ``JaxLoader(..., state=sd)`` resumes
    there. A committed dataset skips whole windows / files / row groups (no
    read of the prefix); other sources read and discard the prefix of the
    resumed epoch (on the host, without converting or transferring it).

    **Prefetch.** ``prefetch=N`` (N >= 1) runs reading, conversion and the
    host->device transfer in a background thread that keeps up to N batches
    on the devices; an exception there is re-raised by the consumer's
    ``next()`` with its original traceback. ``prefetch=0`` does everything in
    the consumer's thread.

    Args:
        source: Dataset, DataIterator, pipeline or committed-dataset URI.
        global_batch_size: Rows per step across all hosts.
        columns: Columns to load (default: all); ``exclude``: columns to leave out.
        dtypes: Host-side casts, column -> dtype (NumPy / JAX dtype or name).
        pad_lengths: Column -> length for variable-length list columns;
            ``pad_values``: column -> pad value (default 0).
        remainder: ``"drop"`` or ``"pad"``.
        mask_key: Name of the mask array with ``remainder="pad"``.
        num_epochs: Epochs to yield (``None``: forever).
        shuffle, seed, shuffle_buffer_rows: Seeded shuffling (see above).
        mesh, partition_spec: Optional user sharding (see above).
        prefetch: Batches kept on device ahead of the consumer.
        ray_prefetch_batches: Ray Data's own host-side prefetch.
        state: A ``state_dict()`` to resume from.
        sync_timeout_s: Timeout of the multi-host key-value exchange.
        storage_options: Passed to ``resolve_filesystem`` for a URI source.
        reader: How a committed-dataset URI is read: ``"local"`` (default) reads
            this host's windows in the loader's process on ``local_read_ahead``
            threads; ``"ray"`` runs one Ray Data task per window. Same rows, same
            order, same batches either way. Ignored for Dataset/iterator sources.
        local_read_ahead: Windows read ahead (and threads) with ``reader="local"``.

    Raises:
        SpecError: Bad arguments, unknown/string/unpadded columns, a global
            batch size the devices cannot split evenly (the message suggests one),
            or a ``state`` saved for another configuration.
    """

    def __init__(
        self,
        source: Any,
        *,
        global_batch_size: int,
        columns: list[str] | None = None,
        exclude: list[str] | tuple[str, ...] = (),
        dtypes: Mapping[str, Any] | None = None,
        pad_lengths: Mapping[str, int] | None = None,
        pad_values: Mapping[str, Any] | None = None,
        remainder: str = "drop",
        mask_key: str = MASK_KEY,
        num_epochs: int | None = 1,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer_rows: int | None = None,
        mesh: Any = None,
        partition_spec: Any = None,
        prefetch: int = 2,
        ray_prefetch_batches: int = 1,
        state: Mapping[str, Any] | None = None,
        sync_timeout_s: float = 600.0,
        storage_options: Mapping[str, Any] | None = None,
        reader: str = "local",
        local_read_ahead: int = 2,
    ):
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        t0 = time.perf_counter()
        if remainder not in ("drop", "pad"):
            raise SpecError(f"JaxLoader: remainder must be 'drop' or 'pad', got {remainder!r}.")
        if num_epochs is not None and num_epochs < 0:
            raise SpecError(f"JaxLoader: num_epochs must be >= 0 or None, got {num_epochs}.")
        if prefetch < 0:
            raise SpecError(f"JaxLoader: prefetch must be >= 0, got {prefetch}.")
        if reader not in ("local", "ray"):
            raise SpecError(f"JaxLoader: reader must be 'local' or 'ray', got {reader!r}.")
        if local_read_ahead < 1:
            raise SpecError(
                f"JaxLoader: local_read_ahead must be >= 1, got {local_read_ahead}."
            )
        self.reader = reader
        self.local_read_ahead = int(local_read_ahead)
        self.remainder = remainder
        self.mask_key = mask_key
        self.num_epochs = num_epochs
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.prefetch = int(prefetch)
        self.ray_prefetch_batches = int(ray_prefetch_batches)
        self.sync_timeout_s = float(sync_timeout_s)
        self.process_count = jax.process_count()
        self.process_index = jax.process_index()

        # --- sharding and batch-size arithmetic
        if mesh is None:
            if partition_spec is not None:
                raise SpecError("JaxLoader: partition_spec= needs mesh= as well.")
            self._sharding = _ray_default_sharding()
            self._spec = self._sharding.spec
            self._mesh = self._sharding.mesh
            batch_shards = jax.device_count()
            what = f"the number of devices ({batch_shards})"
            self._through_ray = True
        else:
            spec = partition_spec if partition_spec is not None else PartitionSpec(
                tuple(mesh.axis_names)
            )
            self._mesh, self._spec = mesh, PartitionSpec(*spec)
            self._sharding = NamedSharding(mesh, self._spec)
            lead = self._spec[0] if len(self._spec) else None
            axes = () if lead is None else (lead,) if isinstance(lead, str) else tuple(lead)
            batch_shards = math.prod(mesh.shape[a] for a in axes)
            what = f"the batch axes {axes} of the mesh ({batch_shards} shards)"
            self._through_ray = False
        unit = math.lcm(batch_shards, self.process_count)
        if (
            not isinstance(global_batch_size, int)
            or global_batch_size <= 0
            or global_batch_size % unit
        ):
            suggest = unit * max(1, -(-global_batch_size // unit)) if isinstance(
                global_batch_size, int
            ) else unit
            raise SpecError(
                f"JaxLoader: global_batch_size ({global_batch_size}) must be a positive "
                f"multiple of {what} and of the number of hosts ({self.process_count}); "
                f"try global_batch_size={suggest}."
            )
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // self.process_count
        if self._through_ray and self.local_batch_size % jax.local_device_count():
            raise SpecError(
                f"JaxLoader: this host's batch ({self.local_batch_size} rows) must be a "
                f"multiple of its local devices ({jax.local_device_count()}); try "
                f"global_batch_size={unit * jax.local_device_count()}."
            )

        # --- source
        self._source = _make_source(source, dict(storage_options or {}))
        schema = self._source.schema()
        self._specs: list[ColumnSpec] = plan_columns(
            schema,
            columns=columns,
            exclude=exclude,
            dtypes=dtypes,
            pad_lengths=pad_lengths,
            pad_values=pad_values,
            reserved=(mask_key,) if remainder == "pad" else (),
        )
        self._read_columns = [s.name for s in self._specs]
        self._row_bytes = sum(
            int(np.prod(s.row_shape, dtype=np.int64)) * s.out_dtype.itemsize for s in self._specs
        )
        if shuffle_buffer_rows is None:
            shuffle_buffer_rows = max(16 * self.local_batch_size, 4096)
        self.shuffle_buffer_rows = int(shuffle_buffer_rows)
        lb = self.local_batch_size
        if self.shuffle:
            rows = self.shuffle_buffer_rows
        else:
            # Decoded bytes per row (the manifest's are compressed): a window is what
            # one reader holds in memory.
            bpr = max(getattr(self._source, "bytes_per_row", 0) or 1, self._row_bytes, 1)
            rows = int(_WINDOW_TARGET_BYTES // bpr)
        self.window_rows = max(lb, -(-rows // lb) * lb)

        # --- multi-host key-value namespace and known row counts
        self._uid = next(_loader_counter)
        self._kv_deleted = 0
        self._share_sizes: list[int] | None = None
        if isinstance(self._source, _ManifestSource):
            self._share_sizes = [
                b - a for a, b in host_shares(self._source.num_rows, self.process_count)
            ]
        elif self._source.local_rows_known is not None:
            local = int(self._source.local_rows_known)
            if self.process_count > 1:
                got = self._exchange("count", str(local))
                self._share_sizes = [int(v) for v in got]
            else:
                self._share_sizes = [local]
        self.steps_per_epoch: int | None = (
            steps_for(self._share_sizes, lb, remainder) if self._share_sizes else None
        )
        if self._share_sizes is not None and self.steps_per_epoch == 0:
            raise SpecError(
                f"JaxLoader: with remainder='drop' no full batch fits: the smallest host "
                f"share has {min(self._share_sizes)} rows, fewer than the local batch "
                f"({lb}); use a smaller global_batch_size or remainder='pad'."
            )

        # --- plan and state
        self._plan = {
            **self._source.fingerprint(),
            "global_batch_size": global_batch_size,
            "process_count": self.process_count,
            "remainder": remainder,
            "shuffle": self.shuffle,
            "window_rows": self.window_rows if isinstance(self._source, _ManifestSource) else None,
            "columns": self._read_columns,
        }
        self._epoch, self._step = 0, 0
        if state is not None:
            self._load_state(state)

        # --- runtime
        self._stats_lock = threading.Lock()
        self._stats = {
            "rows": 0,
            "batches": 0,
            "bytes": 0,
            "dropped_rows": 0,
            "padded_rows": 0,
            "host_copies": 0,
            "host_copy_batches": 0,
            "input_stall_s_total": 0.0,
            "input_stall_s_max": 0.0,
            "input_stall_s_last": 0.0,
            "time_to_first_batch_s": None,
        }
        self._t0 = t0
        self._shardings: dict[int, Any] = {}  # ndim -> NamedSharding
        self._gen: Iterator | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    # ------------------------------------------------------------------ public

    def state_dict(self) -> dict:
        """Small JSON-serialisable state: position of the next batch the consumer gets."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "step": self._step,
            "seed": self.seed,
            "plan": dict(self._plan),
        }

    def stats(self) -> dict:
        """Counters: rows (real rows delivered by this host), batches, bytes (host
        bytes delivered), dropped_rows, padded_rows, host_copies (full-column copies
        made while converting), input stall (time ``next()`` waited, total/max/last/
        mean per step), time_to_first_batch_s (from construction)."""
        with self._stats_lock:
            s = dict(self._stats)
        s["input_stall_s_mean"] = s["input_stall_s_total"] / max(s["batches"], 1)
        s["steps_per_epoch"] = self.steps_per_epoch
        return s

    def __iter__(self) -> "JaxLoader":
        return self

    def __next__(self) -> dict:
        if self._closed:
            raise StopIteration
        t = time.perf_counter()
        if self.prefetch == 0:
            if self._gen is None:
                self._gen = self._produce()
            try:
                item = next(self._gen)
            except StopIteration:
                self._closed = True
                raise
        else:
            if self._thread is None:
                self._start_thread()
            kind, item = self._queue.get()
            if kind == "end":
                self._closed = True
                raise StopIteration
            if kind == "error":
                self._closed = True
                raise item  # keeps the producer's traceback (item.__traceback__)
        batch, epoch, step, nrows, nbytes = item
        stall = time.perf_counter() - t
        self._advance(epoch, step)
        with self._stats_lock:
            s = self._stats
            s["batches"] += 1
            s["rows"] += nrows
            s["bytes"] += nbytes
            s["input_stall_s_total"] += stall
            s["input_stall_s_last"] = stall
            s["input_stall_s_max"] = max(s["input_stall_s_max"], stall)
            if s["time_to_first_batch_s"] is None:
                s["time_to_first_batch_s"] = time.perf_counter() - self._t0
        return batch

    def close(self) -> None:
        """Stops the prefetch thread (also done at exhaustion and garbage collection)."""
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._queue is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.05)
                except queue.Empty:
                    pass

    def __enter__(self) -> "JaxLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._stop.set()
        except Exception:
            pass

    # ------------------------------------------------------------------ state

    def _load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise SpecError(
                f"JaxLoader: state version {state.get('version')!r} is not supported "
                f"(expected {_STATE_VERSION})."
            )
        if int(state.get("seed", -1)) != self.seed:
            raise SpecError(
                f"JaxLoader: state was saved with seed={state.get('seed')}, this loader has "
                f"seed={self.seed}; pass the same seed to resume."
            )
        saved = dict(state.get("plan") or {})
        for k, v in self._plan.items():
            if k in saved and saved[k] != v:
                raise SpecError(
                    f"JaxLoader: state was saved with {k}={saved[k]!r}, this loader has "
                    f"{k}={v!r}; resume with the same data and configuration."
                )
        self._epoch, self._step = int(state["epoch"]), int(state["step"])

    def _advance(self, epoch: int, step: int) -> None:
        self._epoch, self._step = epoch, step + 1
        if self.steps_per_epoch is not None and self._step >= self.steps_per_epoch:
            self._epoch, self._step = epoch + 1, 0

    def _count_copies(self, copies: int, rows: int) -> None:
        with self._stats_lock:
            self._stats["host_copies"] += copies
            self._stats["host_copy_batches"] += 1

    # ------------------------------------------------------------------ multi-host

    def _exchange(self, tag: str, value: str) -> list[str]:
        """All hosts' ``value`` for ``tag`` via jax.distributed's key-value store."""
        if self.process_count == 1:
            return [value]
        client = jax_kv_client()
        if client is None:
            raise RuntimeError(
                "JaxLoader: jax.process_count() > 1 but jax.distributed has no client; "
                "call jax.distributed.initialize() before creating the loader."
            )
        prefix = f"{_KV_PREFIX}/{self._uid}/{tag}"
        client.key_value_set(f"{prefix}/{self.process_index}", value)
        out = []
        for h in range(self.process_count):
            try:
                out.append(
                    client.blocking_key_value_get(f"{prefix}/{h}", int(self.sync_timeout_s * 1000))
                )
            except Exception as e:
                raise TimeoutError(
                    f"JaxLoader: host {h} did not report {tag!r} within {self.sync_timeout_s} s "
                    f"(is it running the same loader, created in the same order?)."
                ) from e
        return out

    # ------------------------------------------------------------------ production

    def _start_thread(self) -> None:
        self._queue = queue.Queue(maxsize=max(self.prefetch, 1))

        def run():
            try:
                for item in self._produce():
                    if not self._put(("batch", item)):
                        return
                self._put(("end", None))
            except BaseException as e:  # noqa: BLE001 - surfaced in the consumer
                self._put(("error", e))

        self._thread = threading.Thread(target=run, name="slicefeed-jaxloader", daemon=True)
        self._thread.start()

    def _put(self, msg) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(msg, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _to_global(self, host: dict[str, np.ndarray]) -> dict:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        # One call for the whole batch: on one process it is a single batched
        # device_put instead of one per column (benchmarks/README.md).
        shardings, shapes = {}, {}
        for k, v in host.items():
            sh = self._shardings.get(v.ndim)
            if sh is None:
                spec = PartitionSpec(*tuple(self._spec)[: v.ndim])
                sh = self._shardings[v.ndim] = NamedSharding(self._mesh, spec)
            shardings[k] = sh
            shapes[k] = (self.global_batch_size,) + v.shape[1:]
        return jax.make_array_from_process_local_data(shardings, host, shapes)

    def _filler(self) -> dict:
        host = empty_batch(self._specs, self.local_batch_size)
        if self.remainder == "pad":
            host[self.mask_key] = np.zeros(self.local_batch_size, dtype=bool)
        return self._to_global(host)

    def _epoch_batches(self, epoch: int, start_step: int):
        """Yields (jax_batch, real_rows) for this host's epoch, from ``start_step``."""
        lb = self.local_batch_size
        src, skip_rows = self._source.dataset_or_iterator(epoch, start_step * lb, self)
        if src is None:
            return
        seed = None if not self.shuffle else (self.seed * 1_000_003 + epoch) % (2**32)
        shuffle_kw = dict(
            local_shuffle_buffer_size=self.shuffle_buffer_rows
            if self.shuffle and not isinstance(self._source, _ManifestSource)
            else None,
            local_shuffle_seed=seed
            if self.shuffle and not isinstance(self._source, _ManifestSource)
            else None,
        )
        if isinstance(src, _LocalWindows):
            collate = _Collate(self)
            for table in src.batches(lb):
                yield self._to_global(collate(table)), table.num_rows
            return
        if self._through_ray and not skip_rows:
            collate = _Collate(self)
            it = src.iter_jax_batches(
                batch_size=lb,
                collate_fn=collate,
                prefetch_batches=self.ray_prefetch_batches,
                drop_last=False,
                synchronize_batches=False,
                **shuffle_kw,
            )
            it = iter(it)
            prev = None
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except Exception:
                    if prev is not None:  # deliver what came before the failure
                        yield prev, lb
                    raise
                if prev is not None:
                    yield prev, lb
                prev = b
            if prev is not None:
                yield prev, collate.partial_rows if collate.partial_rows is not None else lb
            return
        # Own path: a user mesh, or discarding a resumed epoch's prefix on the host.
        it = src.iter_batches(
            batch_size=lb,
            batch_format="pyarrow",
            prefetch_batches=self.ray_prefetch_batches,
            drop_last=False,
            **shuffle_kw,
        )
        to_skip = skip_rows // lb
        collate = _Collate(self)
        for table in it:
            if to_skip:
                to_skip -= 1
                continue
            host = collate(table)
            yield self._to_global(host), table.num_rows

    def _produce(self):
        """Yields (batch, epoch, step, rows, bytes) in order; runs in the prefetch thread."""
        lb = self.local_batch_size
        epoch, start = self._epoch, self._step
        while self.num_epochs is None or epoch < self.num_epochs:
            if self._stop.is_set():
                return
            stream = self._epoch_batches(epoch, start)
            if self.steps_per_epoch is not None:
                yield from self._known_epoch(stream, epoch, start)
            else:
                yield from self._agreed_epoch(stream, epoch, start)
            epoch, start = epoch + 1, 0

    def _emit(self, batch, epoch, step, nrows):
        pad = self.local_batch_size - nrows
        with self._stats_lock:
            self._stats["padded_rows"] += pad
        return batch, epoch, step, nrows, nrows * self._row_bytes

    def _drop(self, rows: int) -> None:
        with self._stats_lock:
            self._stats["dropped_rows"] += rows

    def _known_epoch(self, stream, epoch, start):
        steps = self.steps_per_epoch
        lb = self.local_batch_size
        step = start
        local = self._share_sizes[self.process_index] if self._share_sizes else None
        for batch, nrows in stream:
            if step >= steps:
                break
            if nrows < lb and self.remainder == "drop":  # pragma: no cover - guarded by steps
                break
            yield self._emit(batch, epoch, step, nrows)
            step += 1
        if self.remainder == "drop" and local is not None:
            # Rows of this host's share beyond the agreed steps (counted, never read).
            self._drop(max(local - steps * lb, 0))
        while step < steps:
            yield self._emit(self._filler(), epoch, step, 0)
            step += 1

    def _agreed_epoch(self, stream, epoch, start):
        """Equal steps when row counts are unknown: per-step status exchange."""
        lb = self.local_batch_size
        step = start
        it = iter(stream)
        pending = next(it, None)
        while True:
            if pending is None:
                status, cur = 0, None
            else:
                cur = pending
                status = 2 if cur[1] == lb else 1
            statuses = [int(v) for v in self._exchange(f"e{epoch}/s{step}", str(status))]
            if self.process_count > 1 and step >= 2:
                self._kv_forget(f"e{epoch}/s{step - 2}")
            if self.remainder == "drop":
                if min(statuses) < 2:
                    left = cur[1] if cur is not None else 0
                    for _, n in it:  # drain to count what this host drops
                        left += n
                    self._drop(left)
                    return
            elif max(statuses) == 0:
                return
            if cur is None:
                yield self._emit(self._filler(), epoch, step, 0)
            else:
                yield self._emit(cur[0], epoch, step, cur[1])
                pending = next(it, None)
            step += 1

    def _kv_forget(self, tag: str) -> None:
        try:
            jax_kv_client().key_value_delete(
                f"{_KV_PREFIX}/{self._uid}/{tag}/{self.process_index}"
            )
        except Exception:  # best effort: keys are tiny
            pass


def _ray_default_sharding():
    """The sharding Ray Data's iter_jax_batches uses (so our filler batches match it)."""
    return jax_sharding_1d()


def _make_source(source: Any, fs_kwargs: dict) -> _Source:
    import ray.data

    if isinstance(source, str) or hasattr(source, "__fspath__"):
        return _ManifestSource(str(source), fs_kwargs)
    if isinstance(source, ray.data.Dataset):
        return _DatasetSource(source)
    if isinstance(source, ray.data.DataIterator):
        return _IteratorSource(source)
    if callable(getattr(source, "dataset", None)):
        ds = source.dataset()
        if not isinstance(ds, ray.data.Dataset):
            raise SpecError(
                f"JaxLoader: {type(source).__name__}.dataset() returned "
                f"{type(ds).__name__}, expected a ray.data.Dataset."
            )
        return _DatasetSource(ds)
    raise SpecError(
        f"JaxLoader: unsupported source {type(source).__name__}; pass a ray.data.Dataset, "
        "a ray.data.DataIterator (ray.train.get_dataset_shard), a pipeline with "
        ".dataset(), or the URI of a committed dataset."
    )
