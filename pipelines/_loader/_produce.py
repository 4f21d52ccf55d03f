"""Production of one host's steps: equal step counts, remainder, conversion and transfer.

Only rows that are delivered are converted and transferred: a partial batch
that ``remainder="drop"`` drops is counted, never converted, padded or sent to
a device.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

from slicefeed.pipelines._loader._agree import Agreement
from slicefeed.pipelines._loader._convert import ColumnSpec, convert_table, empty_batch, pad_batch
from slicefeed.pipelines._loader._placement import Placement
from slicefeed.pipelines._loader._plan import ElasticEpoch
from slicefeed.pipelines._loader._sources import ReadContext, Source


class Stats:
    """Counters shared by the producer and the consumer (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {
            "rows": 0,
            "batches": 0,
            "bytes": 0,
            "dropped_rows": 0,
            "padded_rows": 0,
            "rows_decoded": 0,
            "rows_decoded_peak": 0,
            "host_copies": 0,
            "host_copy_bytes": 0,
            "host_copy_batches": 0,
            "input_stall_s_total": 0.0,
            "input_stall_s_max": 0.0,
            "input_stall_s_last": 0.0,
            "time_to_first_batch_s": None,
        }

    def add(self, **kw: int) -> None:
        with self.lock:
            for k, v in kw.items():
                self.values[k] += v

    def record(self, counts: dict) -> None:
        """Adds a reader's counters (``*_peak`` keys keep the maximum)."""
        with self.lock:
            for k, v in counts.items():
                if k.endswith("_peak"):
                    self.values[k] = max(self.values[k], v)
                else:
                    self.values[k] += v


class Producer:
    """Yields ``(batch, epoch, step, rows, bytes)`` for every step from a position.

    Holds no reference to the loader (so a dropped loader can be collected while
    this runs in the prefetch thread).
    """

    def __init__(
        self,
        *,
        source: Source,
        ctx: ReadContext,
        specs: list[ColumnSpec],
        placement: Placement,
        agreement: Agreement,
        remainder: str,
        mask_key: str,
        num_epochs: int | None,
        steps_per_epoch: int | None,
        local_share: int | None,
        row_bytes: int,
        stats: Stats,
    ):
        self.source = source
        self.ctx = ctx
        self.specs = specs
        self.placement = placement
        self.agreement = agreement
        self.remainder = remainder
        self.mask_key = mask_key if remainder == "pad" else None
        self.num_epochs = num_epochs
        self.steps = steps_per_epoch
        self.local_share = local_share
        self.row_bytes = row_bytes
        self.stats = stats
        self.lb = ctx.batch_rows
        # (epoch, plan) of a committed dataset's epoch resumed on another host layout.
        self.resumed: tuple[int, ElasticEpoch] | None = None

    def restarted(
        self, stop: threading.Event, resumed: tuple[int, ElasticEpoch] | None = None
    ) -> Producer:
        """A copy that stops on ``stop`` and uses fresh agreement keys (every host
        restarts its loader the same number of times, as it creates loaders);
        ``resumed`` replaces the plan of one epoch (see ``_plan.elastic_epoch``)."""
        out = copy.copy(self)
        out.ctx = dataclasses.replace(self.ctx, stop=stop)
        out.agreement = self.agreement.next_generation()
        out.resumed = resumed
        return out

    def items(self, epoch: int, start: int) -> Iterator[tuple]:
        while self.num_epochs is None or epoch < self.num_epochs:
            if self.ctx.stop.is_set():
                return
            ctx, steps, share = self.ctx, self.steps, self.local_share
            if self.resumed is not None and self.resumed[0] == epoch:
                plan = self.resumed[1]
                ctx = dataclasses.replace(ctx, spans=plan.spans)
                steps, share = plan.steps, plan.share
            tables = self.source.tables(epoch, start * self.lb, ctx)
            try:
                if steps is not None:
                    yield from self._known_epoch(tables, epoch, start, ctx, steps, share)
                else:
                    yield from self._agreed_epoch(tables, epoch, start)
            finally:
                close = getattr(tables, "close", None)
                if close is not None:
                    close()
            epoch, start = epoch + 1, 0

    # ------------------------------------------------------------------ one batch

    def _convert(self, table, epoch: int, first_row: int, ctx: ReadContext) -> tuple[dict, int]:
        counter = [0, 0]  # column copies, bytes copied
        source = self.source

        def locate(i: int) -> str:
            return source.locate(epoch, first_row + i, ctx)

        host = convert_table(self.specs, table, counter, locate)
        n = table.num_rows
        if n < self.lb:
            host = pad_batch(host, self.specs, self.lb)
            counter[0] += len(host)  # every column is copied into its padded array
            counter[1] += sum(a.nbytes for a in host.values())
        if self.mask_key:
            host[self.mask_key] = np.arange(self.lb) < n
        self.stats.add(host_copies=counter[0], host_copy_bytes=counter[1], host_copy_batches=1)
        return self.placement.to_global(host), n

    def _filler(self) -> dict:
        host = empty_batch(self.specs, self.lb)
        if self.mask_key:
            host[self.mask_key] = np.zeros(self.lb, dtype=bool)
        return self.placement.to_global(host)

    def _emit(self, batch, epoch: int, step: int, nrows: int) -> tuple:
        self.stats.add(padded_rows=self.lb - nrows)
        return batch, epoch, step, nrows, nrows * self.row_bytes

    # ------------------------------------------------------------------ epochs

    def _known_epoch(self, tables, epoch: int, start: int, ctx: ReadContext, steps: int,
                     local_share: int | None):
        lb = self.lb
        step = start
        for table in tables:
            if step >= steps or self.ctx.stop.is_set():
                break
            if table.num_rows < lb and self.remainder == "drop":
                break  # dropped: never converted
            batch, n = self._convert(table, epoch, step * lb, ctx)
            yield self._emit(batch, epoch, step, n)
            step += 1
        if self.remainder == "drop" and local_share is not None:
            # Rows of this host's share beyond the agreed steps (counted, not delivered).
            self.stats.add(dropped_rows=max(local_share - steps * lb, 0))
        while step < steps and not self.ctx.stop.is_set():
            yield self._emit(self._filler(), epoch, step, 0)
            step += 1

    def _agreed_epoch(self, tables, epoch: int, start: int):
        """Equal steps when row counts are unknown: a per-step status exchange
        (2 full batch, 1 partial, 0 none)."""
        lb, step = self.lb, start
        it = iter(tables)
        pending = next(it, None)
        while True:
            status = 0 if pending is None else 2 if pending.num_rows == lb else 1
            statuses = [
                int(v)
                for v in self.agreement.exchange(f"e{epoch}/s{step}", str(status), self.ctx.stop)
            ]
            if step >= 2:
                self.agreement.forget(f"e{epoch}/s{step - 2}")
            if self.remainder == "drop":
                if min(statuses) < 2:
                    left = pending.num_rows if pending is not None else 0
                    for t in it:  # drain to count what this host drops (not converted)
                        left += t.num_rows
                    self.stats.add(dropped_rows=left)
                    return
            elif max(statuses) == 0:
                return
            if pending is None:
                yield self._emit(self._filler(), epoch, step, 0)
            else:
                batch, n = self._convert(pending, epoch, step * lb, self.ctx)
                yield self._emit(batch, epoch, step, n)
                pending = next(it, None)
            step += 1
