"""JaxLoader: static-shape, device-sharded, equal-step, resumable JAX batches."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Self

from slicefeed.connectors import SpecError
from slicefeed.connectors._errors import short_repr as _short
from slicefeed.pipelines._loader import _plan
from slicefeed.pipelines._loader._agree import Agreement
from slicefeed.pipelines._loader._convert import MASK_KEY, check_table, plan_columns, row_bytes
from slicefeed.pipelines._loader._options import LoaderOptions
from slicefeed.pipelines._loader._placement import Placement
from slicefeed.pipelines._loader._prefetch import Runtime
from slicefeed.pipelines._loader._produce import Producer, Stats
from slicefeed.pipelines._loader._sources import (
    ManifestSource,
    ReadContext,
    make_source,
    read_ahead_bytes_max,
)

#: Version 4: the host layout ("hosts") and the epoch's earlier layouts ("stages")
#: are recorded apart from the plan, so a committed dataset resumes on other hosts
#: (a version-3 state is upgraded). Version 3: committed datasets are read in
#: row-group windows (another row order than version 2's file windows), so a
#: version-2 state cannot resume exactly.
STATE_VERSION = 4
# Rows per read window of a committed dataset when not shuffling: ~32 MB of decoded
# rows per read (benchmarks/loader.py: 64 MB of *compressed* Parquet made the first
# window 4x larger and multiplied the time to first batch).
WINDOW_TARGET_BYTES = 32 << 20


class JaxLoader:
    """Global, device-sharded, static-shape ``jax.Array`` batches for a training loop.

    Each step yields ``dict[str, jax.Array]``: one global array per selected
    column, ``global_batch_size`` rows, sharded over the batch axis of ``mesh``
    (default: a 1-D ``"data"`` mesh over all devices, the one Ray Data's
    ``iter_jax_batches`` uses). Every host takes the same number of steps per
    epoch; every row of an epoch is delivered once, or counted as dropped.

    Contract:

    - Values are never changed silently. A 64-bit column with ``jax_enable_x64``
      off is refused unless ``dtypes`` casts it; every ``dtypes`` cast is
      range-checked on the host; bfloat16 stored as ``uint16`` bits (slicefeed's
      convention) arrives as bfloat16 with the same bits. Errors name the
      column, the row (file and row where known) and the value.
    - ``remainder="drop"`` drops a partial last batch without converting or
      transferring it; ``"pad"`` pads with ``pad_values`` (default 0) and adds
      a boolean ``mask_key`` array (False on padding).
    - ``prefetch=N`` keeps at most N batches on the devices ahead of the
      consumer (``0``: produce in the consumer's thread). A producer error is
      re-raised by every later ``next()`` with its original traceback.
    - ``state_dict()`` is the position of the next batch the consumer gets
      (the same on every host); ``state=`` resumes there exactly, and refuses a
      state saved for other data or configuration, naming every key that
      differs. For a committed dataset the state may come from another number
      of hosts (same ``global_batch_size``): what the old hosts had left of the
      epoch is re-split among the new ones, so over the epoch every row is
      still delivered once (``"pad"``; ``"drop"`` drops at most one batch per
      host at its end), and later epochs are planned for the new hosts.
    - ``close()`` (or dropping the last reference) stops reading and frees the
      prefetched batches within about a second.
    - Loaders must be created in the same order on every host (multi-host
      agreement uses numbered keys of the ``jax.distributed`` key-value store).

    How sources are read, shuffled, split across hosts and resumed, and what
    each step costs in copies and time: docs/architecture.md, "JaxLoader".

    Args:
        source: ``ray.data.Dataset`` (any block format), ``DataIterator``
            (``ray.train.get_dataset_shard``), a slicefeed ``Pipeline`` (or any
            object with ``.dataset()``), or the URI of a committed dataset.
        global_batch_size: Rows per step across all hosts.
        columns: Columns to load (default: all); ``exclude``: columns to leave out.
        dtypes: Host-side, range-checked casts, column -> dtype (NumPy / JAX
            dtype or name such as ``"bfloat16"``; a non-native byte order such
            as ``">i4"`` is delivered in native order, ``None`` is refused).
        pad_lengths: Column -> length for variable-length list columns.
        pad_values: Column -> pad value for every column kind (default 0).
        remainder: ``"drop"`` or ``"pad"``; ``mask_key``: the mask's name.
        num_epochs: Epochs to yield (``None``: forever).
        shuffle, seed, shuffle_buffer_rows: Seeded shuffling; ``seed`` is an
            integer in ``[0, 2**32)`` for every source, each giving its own order.
        mesh, partition_spec: Optional user sharding.
        prefetch: Batches kept on device ahead of the consumer.
        ray_prefetch_batches: Ray Data's own host-side prefetch.
        state: A ``state_dict()`` to resume from.
        sync_timeout_s: Timeout of the multi-host key-value exchange. The
            hosts agree on groups of up to 16 steps per exchange (also when
            every host knows the steps, so that a conversion error ends every
            host after the same steps); each host then holds up to that many
            local batches read ahead and converted (at most about 32 MB of them). Every host takes
            the same steps: a host whose source fails publishes its error
            before its next exchange, and the other hosts raise a
            ``RuntimeError`` naming it there; a host that stops reporting makes
            every host raise a ``TimeoutError`` naming it after this long.
        storage_options: Passed to ``resolve_filesystem`` for a URI source.
        reader: For a committed dataset: ``"local"`` reads windows in this
            process on ``local_read_ahead`` threads; ``"ray"`` runs one Ray Data
            task per window. Same batches either way.
        local_read_ahead: Windows read ahead with ``reader="local"``.
        host_local: The source (a Dataset, or an object with ``.dataset()``) holds
            only this host's own rows. Without it, on several JAX processes a
            Dataset is refused (every process would deliver all of it); a
            committed URI and a slicefeed ``Pipeline`` (split by input files) are
            split per host, a ``DataIterator`` is already split by Ray Train.

    Raises:
        SpecError: Bad arguments; unknown, string, unpadded or 64-bit columns
            (see ``dtypes``); a global batch the devices cannot split evenly
            (the message suggests one); an empty source; a ``state`` saved for
            another configuration. From ``next()``: a value ``dtypes`` cannot
            hold; a shard of a committed dataset whose schema is not its
            manifest's for a delivered column (another type or bfloat16 marker;
            ``MissingColumnError``: the column is missing), whatever the shuffle
            window; only a difference in declared nullability is accepted.
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
        host_local: bool = False,
    ):
        import jax

        t0 = time.perf_counter()
        opts = LoaderOptions(
            global_batch_size=global_batch_size,
            columns=columns,
            exclude=exclude,
            dtypes=dtypes,
            pad_lengths=pad_lengths,
            pad_values=pad_values,
            remainder=remainder,
            mask_key=mask_key,
            num_epochs=num_epochs,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer_rows=shuffle_buffer_rows,
            prefetch=prefetch,
            ray_prefetch_batches=ray_prefetch_batches,
            sync_timeout_s=sync_timeout_s,
            storage_options=storage_options,
            reader=reader,
            local_read_ahead=local_read_ahead,
            host_local=host_local,
        )
        self.options = opts
        try:
            placement = Placement(opts.global_batch_size, mesh=mesh, partition_spec=partition_spec)
        except SpecError as e:
            hosts = state.get("hosts") if isinstance(state, Mapping) else None
            if isinstance(hosts, Mapping) and hosts.get("process_count") != jax.process_count():
                raise SpecError(
                    f"{e} (That size is for a fresh start: the state being resumed was saved "
                    f"on {_short(hosts.get('process_count'))} host(s), and a resumed run keeps "
                    "its global_batch_size, so resume it on a host count whose devices split it.)"
                ) from None
            raise
        self.global_batch_size = placement.global_batch_size
        self.local_batch_size = lb = placement.local_batch_size
        self.process_count = placement.process_count
        self.process_index = placement.process_index
        self.sharding = placement.sharding

        agreement = Agreement(self.process_index, self.process_count, opts.sync_timeout_s)

        def open_source(version: int | None):
            return make_source(
                source,
                opts.storage_options,
                process_index=self.process_index,
                process_count=self.process_count,
                host_local=opts.host_local,
                first_read=None if opts.shuffle else (lb, opts.ray_prefetch_batches),
                version=version,
            )

        src = open_source(_state_dataset_version(state))
        if isinstance(src, ManifestSource) and self.process_count > 1 and (
                _state_dataset_version(state) is None):
            # Each host opened the dataset's current version: a commit between two
            # hosts' reads (a nightly overwrite) would give them other rows and
            # step counts, and the SPMD program would hang. All read the newest
            # version any of them opened.
            newest = max(int(v) for v in agreement.exchange("dataset_version", str(src.version)))
            if newest != src.version:
                src = open_source(newest)
        self._source = src
        shares = src.share_sizes(self.process_count)
        if shares is not None and sum(shares) == 0:
            # Before the columns: a dataset committed empty may have no schema.
            raise SpecError(_plan.nothing_to_load(self.process_count, lb, opts.remainder,
                                                  any_rows=False))
        specs = plan_columns(
            src.schema(),
            columns=list(opts.columns) if opts.columns is not None else None,
            exclude=opts.exclude,
            dtypes=opts.dtypes,
            pad_lengths=opts.pad_lengths,
            pad_values=opts.pad_values,
            reserved=(opts.mask_key,) if opts.remainder == "pad" else (),
            x64=bool(jax.config.jax_enable_x64),
        )
        rbytes = row_bytes(specs)
        self.shuffle_buffer_rows = opts.shuffle_buffer_rows or max(16 * lb, 4096)
        self.window_rows = _plan.window_size(
            shuffle=opts.shuffle,
            shuffle_buffer_rows=self.shuffle_buffer_rows,
            # Decoded bytes per row (the manifest's are compressed): a window is
            # what one reader holds in memory.
            bytes_per_row=max(getattr(src, "bytes_per_row", 0) or 1, rbytes, 1),
            target_bytes=WINDOW_TARGET_BYTES,
            local_batch_size=lb,
        )

        # --- equal steps
        if shares is None and src.local_rows() is not None:
            got = agreement.exchange("count", str(int(src.local_rows())))
            shares = [int(v) for v in got]
        self.steps_per_epoch: int | None = (
            _plan.steps_for(shares, lb, opts.remainder) if shares else None
        )
        if shares is not None and self.steps_per_epoch == 0:
            raise SpecError(_plan.nothing_to_load(
                self.process_count, lb, opts.remainder,
                any_rows=sum(shares) > 0, smallest_share=min(shares)))
        local_share = shares[self.process_index] if shares else None
        limit = None
        if self.steps_per_epoch is not None and local_share is not None:
            limit = _plan.delivered_rows(local_share, self.steps_per_epoch, lb, opts.remainder)

        # --- plan and state
        self._plan = {
            **src.fingerprint(),
            "global_batch_size": self.global_batch_size,
            "remainder": opts.remainder,
            "shuffle": opts.shuffle,
            "columns": [s.name for s in specs],
        }
        # The host layout: may differ in a resumed state (committed datasets only).
        self._hosts = {
            "process_count": self.process_count,
            "local_batch_size": lb,
            "window_rows": self.window_rows if isinstance(src, ManifestSource) else None,
        }
        self._epoch, self._step = 0, 0
        # An epoch resumed on another layout: (epoch, its earlier stages, this host's plan).
        self._resumed: tuple[int, list[_plan.Stage], _plan.ElasticEpoch] | None = None
        if state is not None:
            self._load_state(state)

        # --- runtime (nothing here refers back to the loader)
        stop = threading.Event()
        ctx = ReadContext(
            batch_rows=lb,
            columns=tuple(s.name for s in specs),
            seed=opts.seed,
            shuffle=opts.shuffle,
            shuffle_buffer_rows=self.shuffle_buffer_rows,
            window_rows=self.window_rows,
            process_index=self.process_index,
            process_count=self.process_count,
            reader=opts.reader,
            read_ahead=opts.local_read_ahead,
            ray_prefetch_batches=opts.ray_prefetch_batches,
            stop=stop,
            limit_rows=limit,
            on_read=None,
            check=functools.partial(check_table, specs, locate=_in_a_block),
        )
        self._stats = Stats()
        # What may be held at once, from the settings (the memory benchmark's bound).
        self._stats.values["read_ahead_bytes_max"] = read_ahead_bytes_max(src, ctx, rbytes)
        self._stats.values["prefetch_bytes_max"] = opts.prefetch * lb * rbytes
        ctx = dataclasses.replace(ctx, on_read=self._stats.record)
        producer = Producer(
            source=src,
            ctx=ctx,
            specs=specs,
            placement=placement,
            agreement=agreement,
            remainder=opts.remainder,
            mask_key=opts.mask_key,
            num_epochs=opts.num_epochs,
            steps_per_epoch=self.steps_per_epoch,
            local_share=local_share,
            row_bytes=rbytes,
            stats=self._stats,
        )
        self._producer = producer
        self._t0 = t0
        self._start_runtime()

    def _start_runtime(self) -> None:
        """A fresh producer runtime from the current position (nothing refers back
        to the loader, so a dropped loader is collected and its finalizer runs)."""
        stop = threading.Event()  # per runtime: an old producer never restarts
        resumed = (self._resumed[0], self._resumed[2]) if self._resumed else None
        producer = self._producer.restarted(stop, resumed)
        start = (self._epoch, self._step)
        self._runtime = Runtime(lambda: producer.items(*start), self.options.prefetch, stop)
        self._finalizer = weakref.finalize(self, self._runtime.close)
        self._done = False
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ options

    @property
    def seed(self) -> int:
        return self.options.seed

    @property
    def shuffle(self) -> bool:
        return self.options.shuffle

    @property
    def remainder(self) -> str:
        return self.options.remainder

    @property
    def mask_key(self) -> str:
        return self.options.mask_key

    @property
    def num_epochs(self) -> int | None:
        return self.options.num_epochs

    @property
    def prefetch(self) -> int:
        return self.options.prefetch

    # ------------------------------------------------------------------ public

    def state_dict(self) -> dict:
        """Small JSON-serialisable state: position of the next batch the consumer gets.

        The same on every host: the data and configuration (``plan``), the host
        layout (``hosts``), the position (``epoch``, ``step``) and, in an epoch
        resumed on another layout, the epoch's earlier layouts (``stages``).
        """
        stages = self._resumed[1] if self._resumed and self._resumed[0] == self._epoch else []
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "step": self._step,
            "seed": self.seed,
            "plan": dict(self._plan),
            "hosts": dict(self._hosts),
            "stages": [dataclasses.asdict(st) for st in stages],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (a ``state_dict()``), also after iterating:
        batches already prefetched are dropped and production restarts there.

        Raises:
            SpecError: ``state`` was saved for other data or configuration.
        """
        self._load_state(state)
        self._finalizer()  # stops the current producer and frees its batches
        self._start_runtime()

    def __len__(self) -> int:
        """Steps per epoch, when known before reading (committed datasets, Datasets
        whose row count Ray knows from metadata). The rest of an epoch resumed
        from a state saved on another host layout has fewer steps.

        Raises:
            TypeError: the count is only found while reading (the hosts agree on
                groups of steps as they go), so there is no length up front.
        """
        if self.steps_per_epoch is None:
            raise TypeError(
                "JaxLoader: steps per epoch are not known before reading this source (its "
                "row count is not in its metadata: a DataIterator, or a Dataset after "
                "map_batches/filter); hosts agree on the steps while reading. Use a "
                "committed dataset URI for a known length."
            )
        return self.steps_per_epoch

    def stats(self) -> dict:
        """Counters of this host: ``rows`` / ``rows_delivered`` (real rows
        delivered), ``rows_decoded`` (rows the reader decoded, or Ray produced,
        including rows read only to be skipped), ``rows_decoded_peak`` (most
        decoded rows one read held at once), batches, bytes (host bytes
        delivered), dropped_rows, padded_rows, ``host_copies`` / ``host_copy_bytes``
        (every host-side copy of a column the loader makes: chunk
        concatenation, bool unpacking, ``dtypes`` casts, list padding, partial-
        batch padding, the shuffle permutation of a window, a window's put into
        Ray's object store with ``reader="ray"``; copies inside Ray Data for a
        Dataset source are Ray's and not counted), input stall (time ``next()``
        waited, total/max/last/mean per step), time_to_first_batch_s (from
        construction), ``agreements`` (key-value exchanges of the step count with
        the other hosts when row counts are unknown: one per group of up to 16
        steps, not one per step; 0 on one host or with known counts), and two
        sizes fixed at construction: ``read_ahead_bytes_max`` (the decoded windows
        the reader may hold ahead, plus on object storage the compressed bytes it
        fetches ahead) and ``prefetch_bytes_max`` (the ``prefetch`` batches on this
        host's devices)."""
        with self._stats.lock:
            s = dict(self._stats.values)
        s["rows_delivered"] = s["rows"]
        s["input_stall_s_mean"] = s["input_stall_s_total"] / max(s["batches"], 1)
        s["steps_per_epoch"] = self.steps_per_epoch
        return s

    def __iter__(self) -> JaxLoader:
        return self

    def __next__(self) -> dict:
        if self._error is not None:
            raise self._error
        if self._done:
            raise StopIteration
        t = time.perf_counter()
        try:
            item = self._runtime.next_item()
        except StopIteration:
            self._done = True
            self._runtime.close()
            raise
        except BaseException as e:
            self._error = e
            self._runtime.close()
            raise
        batch, epoch, step, nrows, nbytes = item
        stall = time.perf_counter() - t
        self._advance(epoch, step)
        with self._stats.lock:
            s = self._stats.values
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
        """Stops reading and frees prefetched batches (also done at exhaustion and
        when the loader is garbage-collected); returns within about a second."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    def _load_state(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise SpecError(
                f"JaxLoader: state is a {type(state).__name__}, not a mapping; pass a "
                "state_dict()."
            )
        if state.get("version") == 2:
            raise SpecError(
                "JaxLoader: this state (version 2) was saved by an older slicefeed that read "
                "committed datasets in another row order; it cannot resume exactly with this "
                f"version (state version {STATE_VERSION}). Start the loader without state= "
                "at the saved epoch boundary, or finish the run with the older slicefeed."
            )
        if state.get("version") == 3:
            state = self._upgrade_v3(state)
        if state.get("version") != STATE_VERSION:
            raise SpecError(
                f"JaxLoader: state version {_short(state.get('version'))} is not supported "
                f"(this slicefeed reads versions 3 and {STATE_VERSION}); start from the "
                "beginning of an epoch (state=None) or resume with the slicefeed version "
                "that saved it."
            )
        if state.get("seed") != self.seed:
            raise SpecError(
                f"JaxLoader: state was saved with seed={_short(state.get('seed'))}, this loader has "
                f"seed={self.seed}; pass the same seed to resume."
            )
        saved = state.get("plan")
        if not isinstance(saved, Mapping):
            raise SpecError(f"JaxLoader: state has no plan (got {_short(saved)}); pass a state_dict().")
        diffs = []
        for k, v in self._plan.items():
            if k not in saved:
                diffs.append(f"{k} is missing from the state (this loader has {k}={_short(v)})")
            elif saved[k] != v:
                diffs.append(f"state was saved with {k}={_short(saved[k])}, this loader has "
                             f"{k}={_short(v)}")
        for k in saved:
            if k not in self._plan:
                diffs.append(f"state has unknown plan key {_short(k)}")
        if diffs:  # a state may be arbitrary user data: a few differences, each cut
            more = f"; and {len(diffs) - 5} more differences" if len(diffs) > 5 else ""
            raise SpecError(
                "JaxLoader: " + "; ".join(diffs[:5]) + more
                + "; resume with the same data and configuration."
            )
        epoch, step = state.get("epoch"), state.get("step")
        if not (_count(epoch) and _count(step)):
            raise SpecError(
                f"JaxLoader: state position epoch={_short(epoch)}, step={_short(step)} is not "
                "valid (non-negative integers expected)."
            )
        hosts = _layout(state.get("hosts"), "hosts", steps=False)
        stages = state.get("stages")
        if not isinstance(stages, list):
            raise SpecError(f"JaxLoader: state key 'stages' is {_short(stages)}, expected a list.")
        stages = [
            _plan.Stage(**_layout(st, f"stages[{i}]", steps=True)) for i, st in enumerate(stages)
        ]
        same = hosts == self._hosts
        if not isinstance(self._source, ManifestSource):
            if not same or stages:
                raise SpecError(
                    f"JaxLoader: state was saved with hosts={hosts!r}, this loader has "
                    f"hosts={self._hosts!r}; only a committed dataset (its URI) resumes on "
                    "another host layout. Resume on the same hosts and global_batch_size."
                )
        elif not same and (step or stages):
            # What the saved layout delivered stays delivered: the rest of the epoch
            # is re-split among this layout's hosts.
            stages = [*stages, _plan.Stage(**hosts, steps=step)]
            step = 0
        resumed = None
        steps = self.steps_per_epoch
        if stages:
            try:
                plan = _plan.elastic_epoch(
                    self._source.units, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                    remainder=self.remainder, stages=stages, process_count=self.process_count,
                    process_index=self.process_index, local_batch_size=self.local_batch_size,
                )
            except ValueError as e:
                raise SpecError(f"JaxLoader: state is not valid for this dataset: {e}.") from None
            resumed, steps = (epoch, stages, plan), plan.steps
            if step == 0 and plan.steps == 0:  # nothing left to deliver in this epoch
                resumed, epoch, steps = None, epoch + 1, self.steps_per_epoch
        if steps is not None and step >= steps:
            raise SpecError(
                f"JaxLoader: state position epoch={_short(epoch)}, step={_short(step)} is not valid for "
                f"this loader ({steps} steps in that epoch)."
            )
        self._epoch, self._step, self._resumed = epoch, step, resumed

    def _upgrade_v3(self, state: Mapping[str, Any]) -> dict:
        """A version-3 state as version 4: its plan held the host count and window
        size (the local batch is the global batch over the hosts) and no dataset
        version (the file list in the fingerprint still identifies the data)."""
        plan = state.get("plan")
        if not isinstance(plan, Mapping):
            return dict(state)  # refused by the plan check
        plan = dict(plan)
        hosts = {"process_count": plan.pop("process_count", None),
                 "window_rows": plan.pop("window_rows", None)}
        count, gbs = hosts["process_count"], plan.get("global_batch_size")
        hosts["local_batch_size"] = gbs // count if _count(count) and count and _count(gbs) else None
        if "dataset_version" in self._plan and "dataset_version" not in plan:
            plan["dataset_version"] = self._plan["dataset_version"]
        return {**state, "version": STATE_VERSION, "plan": plan, "hosts": hosts, "stages": []}

    def _advance(self, epoch: int, step: int) -> None:
        steps = self.steps_per_epoch
        if self._resumed is not None and self._resumed[0] == epoch:
            steps = self._resumed[2].steps
        self._epoch, self._step = epoch, step + 1
        if steps is not None and self._step >= steps:
            self._epoch, self._step = epoch + 1, 0


def _in_a_block(i: int) -> str:
    return f"row {i} of a block the source delivered"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_LAYOUT_KEYS = ("process_count", "local_batch_size", "window_rows")


def _layout(value: Any, key: str, *, steps: bool) -> dict:
    """A state's host layout (``steps``: a stage, with the steps it took), checked."""
    keys = _LAYOUT_KEYS + (("steps",) if steps else ())
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise SpecError(
            f"JaxLoader: state key {key!r} is {_short(value)}; expected a mapping with keys "
            f"{', '.join(keys)}. Pass a state_dict() of this slicefeed version."
        )
    for k in keys:
        v = value[k]
        ok = (v is None and k == "window_rows" and not steps) or (
            _count(v) and (v > 0 or k == "steps")
        )
        if not ok:
            raise SpecError(f"JaxLoader: state key {key}.{k} is {_short(v)}, not a valid count.")
    return {k: value[k] for k in keys}


def _state_dataset_version(state: Any) -> int | None:
    """The committed-dataset version a state was saved on (a resumed loader opens it)."""
    plan = state.get("plan") if isinstance(state, Mapping) else None
    v = plan.get("dataset_version") if isinstance(plan, Mapping) else None
    return v if _count(v) and v > 0 else None
