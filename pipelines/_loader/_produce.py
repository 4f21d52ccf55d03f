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
from typing import Any

import numpy as np

from slicefeed.connectors import SpecError
from slicefeed.pipelines._loader import _plan
from slicefeed.pipelines._loader._agree import Agreement
from slicefeed.pipelines._loader._convert import ColumnSpec, convert_table, empty_batch, pad_batch
from slicefeed.pipelines._loader._placement import Placement
from slicefeed.pipelines._loader._plan import ElasticEpoch
from slicefeed.pipelines._loader._sources import ReadContext, Source

#: Most steps the hosts agree on in one key-value exchange when row counts are
#: unknown; each host holds at most that many tables read ahead, and at most about
#: GROUP_BYTES of them (the memory of one committed-dataset read window).
GROUP_MAX = 16
GROUP_BYTES = 32 << 20


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
            "agreements": 0,
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
        # Steps agreed per exchange (see _agreed_epoch); one host needs no exchange.
        self.group = 1
        self.group_max = 1 if agreement.process_count == 1 else max(
            1, min(GROUP_MAX, GROUP_BYTES // max(self.lb * row_bytes, 1)))
        # Tag of this host's next exchange (unknown row counts): where a failure is published.
        self.next_tag = ""
        # (epoch, plan) of a committed dataset's epoch resumed on another host layout.
        self.resumed: tuple[int, ElasticEpoch] | None = None
        # An epoch of known steps whose reads started before the previous one's
        # end (see _read_next): (epoch, tables, [runs started]).
        self._next_tables: tuple[int, Any, list[int]] | None = None

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
        self._next_tables = None
        try:
            yield from self._epochs(epoch, start)
        finally:
            self._close_next()

    def _epochs(self, epoch: int, start: int) -> Iterator[tuple]:
        while self.num_epochs is None or epoch < self.num_epochs:
            if self.ctx.stop.is_set():
                return
            ctx, steps, share = self.ctx, self.steps, self.local_share
            if self.resumed is not None and self.resumed[0] == epoch:
                plan = self.resumed[1]
                ctx = dataclasses.replace(ctx, spans=plan.spans)
                steps, share = plan.steps, plan.share
            # A read or conversion error is published before it is raised, under
            # the tag of the exchange this host was about to make (see _agreed_epoch).
            self.next_tag = f"e{epoch}/s{start}"
            try:
                if steps is not None:
                    ahead, self._next_tables = self._next_tables, None
                    if ahead is not None and ahead[0] == epoch and start == 0:
                        tables = ahead[1]
                    else:
                        if ahead is not None:
                            ahead[1].close()
                        tables = self.source.tables(epoch, start * self.lb,
                                                    self._reading(ctx, epoch))
                else:
                    tables = self.source.tables(epoch, start * self.lb, ctx)
            except Exception as e:
                self._publish(e)
                raise
            try:
                if steps is not None:
                    yield from self._known_epoch(tables, epoch, start, ctx, steps, share)
                else:
                    yield from self._agreed_epoch(tables, epoch, start)
            except Exception as e:
                self._publish(e)
                raise
            finally:
                close = getattr(tables, "close", None)
                if close is not None:
                    close()
            epoch, start = epoch + 1, 0

    def _reading(self, ctx: ReadContext, epoch: int) -> ReadContext:
        """``ctx`` for reading an epoch of known steps: as its readers run out of
        runs, the next epoch's runs take their places one by one, so a new epoch
        begins without waiting for its first window."""
        nxt = epoch + 1
        if ((self.num_epochs is not None and nxt >= self.num_epochs)
                or (self.resumed is not None and self.resumed[0] == nxt)):
            return ctx
        return dataclasses.replace(ctx, on_spare_reader=lambda: self._read_next(nxt))

    def _read_next(self, epoch: int) -> None:
        """One more run of ``epoch`` may be read (see ``ReadContext.on_spare_reader``)."""
        if self.ctx.stop.is_set():
            return
        if self._next_tables is None:
            tables = self.source.tables(epoch, 0, self._reading(self.ctx, epoch))
            self._next_tables = (epoch, tables, [0])
        _, tables, started = self._next_tables
        start = getattr(tables, "start", None)
        if start is not None:
            started[0] += 1
            start(started[0])

    def _close_next(self) -> None:
        ahead, self._next_tables = self._next_tables, None
        close = None if ahead is None else getattr(ahead[1], "close", None)
        if close is not None:
            close()

    def _empty_epoch(self, epoch: int, reports: list[tuple[int, ...]]) -> SpecError:
        """The error for an epoch of no steps (a source of unknown row count): the
        same as a source of known counts gets at construction; without it an
        endless loader would run empty epochs forever."""
        return SpecError(_plan.nothing_to_load(len(reports), self.lb, self.remainder,
                                               any_rows=any(h for h, _, _ in reports),
                                               epoch=epoch))

    def _publish(self, error: BaseException) -> None:
        """Tells the other hosts this one failed before its next exchange (see
        ``_agreed_epoch``); a no-op for a tag already decided (an exchange's own
        error) and when stopping."""
        if not self.ctx.stop.is_set():
            self.agreement.fail(self.next_tag, error)

    # ------------------------------------------------------------------ one batch

    def _host(self, table, epoch: int, first_row: int, ctx: ReadContext) -> dict:
        """One local batch as host arrays (padded, with the mask): the conversion
        that can fail on bad values, before any device transfer."""
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
        return host

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
        """The ``steps`` steps of an epoch every host knows up front.

        On several hosts the steps are still agreed in rounds, as in
        :meth:`_agreed_epoch`: a value one host cannot convert (out of range
        for ``dtypes=``, a null) or a read that fails is found only when its
        batch is converted, so a round's batches are read and converted before
        the round's exchange, and the failing host publishes its error under
        that round's tag instead of reporting it. The other hosts then raise
        naming it, after the same steps, instead of taking steps it will not
        take. The exchange carries no count (every host knows the steps);
        rounds grow from 1 to ``group_max`` steps, the same on every host.

        The next round is converted while this one is delivered, one batch per
        step delivered, so conversion overlaps the consumer as on one host; an
        error converting it is raised once this round (agreed by every host) is
        delivered. What a host holds is about one round: each delivered step
        is let go as the next round's is converted. On one host there is no
        exchange and rounds are one step.
        """
        lb = self.lb
        it = iter(tables)
        agree = self.agreement.process_count > 1
        stop = self.ctx.stop
        more = True  # this host may have another full batch (or, for "pad", any)
        group, sent = 1, []

        def ended() -> None:
            if self.remainder == "drop" and local_share is not None:
                # Rows of this host's share beyond the agreed steps (counted, not delivered).
                self.stats.add(dropped_rows=max(local_share - steps * lb, 0))

        def convert(at: int) -> tuple[dict, int] | None:
            """Host arrays and rows of step ``at``; None for a fully masked step."""
            nonlocal more
            table = next(it, None) if more else None
            if table is None or (table.num_rows < lb and self.remainder == "drop"):
                if more:
                    more = False  # a partial batch "drop" drops is never converted
                    ended()
                return None
            return self._host(table, epoch, at * lb, ctx), table.num_rows

        def convert_next(nxt: list, failed: list, first: int, n: int) -> None:
            """Converts the next of the ``n`` steps from ``first`` into ``nxt``; an
            error goes to ``failed``, raised once this round (agreed by every host)
            is delivered."""
            if not failed and len(nxt) < n:
                try:
                    nxt.append(convert(first + len(nxt)))
                except Exception as e:  # noqa: BLE001 - raised after the round
                    failed.append(e)

        step = start
        held = [convert(step + i) for i in range(min(group, max(steps - step, 0)))]
        while held and not stop.is_set():
            tag = f"e{epoch}/s{step}"
            if agree:
                self.agreement.exchange(tag, "ok", stop)
                self.stats.add(agreements=1)
                sent.append(tag)
                if len(sent) > 2:  # every host has decided it: each has set a later key
                    self.agreement.forget(sent.pop(0))
                group = min(2 * group, self.group_max)
            after = step + len(held)
            n_next = min(group, steps - after)
            # A failure from here on is published under the next round's tag.
            self.next_tag = f"e{epoch}/s{after}" if after < steps else f"e{epoch + 1}/s0"
            nxt: list[tuple[dict, int] | None] = []
            failed: list[Exception] = []
            while held:
                if stop.is_set():
                    return
                item = held.pop(0)  # delivered steps are not held: about one round in all
                if item is None:
                    yield self._emit(self._filler(), epoch, step, 0)
                else:
                    yield self._emit(self.placement.to_global(item[0]), epoch, step, item[1])
                step += 1
                convert_next(nxt, failed, after, n_next)
            while not failed and len(nxt) < n_next and not stop.is_set():
                convert_next(nxt, failed, after, n_next)
            if failed:
                raise failed[0]
            held = nxt
        if more:
            ended()

    def _agreed_epoch(self, tables, epoch: int, start: int):
        """Equal steps when row counts are unknown, agreed per group of steps.

        Each round, every host reads ahead until it holds ``group`` local batches
        (or its data ends), converts them to host arrays, and reports
        ``held,full,end``: batches held, leading full ones among them, whether its
        data ended. All hosts then take the same number of steps from what they
        hold before the next exchange:

        - ``"drop"``: ``min(full)`` steps; the epoch ends after them if a host
          whose full batches run out at that point (ended, or a partial batch
          next) is among the minimum; its remaining rows are counted, and a
          partial batch is never converted.
        - ``"pad"``: ``min(held)`` over hosts whose data has not ended, or, once
          every host's has, ``max(held)`` steps and the epoch ends; a host out of
          batches takes fully masked steps.

        ``group`` starts at 1 (the first batch waits for one table, as before) and
        doubles after every round in which every host held a full group, up to
        ``self.group_max`` (at most ``group_max`` batches of ``local_batch_size``
        rows are held beyond what the source itself reads ahead).

        A host takes no step that another host might not take: a read or
        conversion error happens before this host reports the round, and is
        published under the round's tag (``Agreement.fail``) before it is raised,
        so the other hosts' exchange of that round raises at once naming this host
        and none of them takes its steps. After a round is agreed only the device
        transfer of each agreed batch remains.
        """
        lb, step = self.lb, start
        it = iter(tables)
        held: list[tuple[dict | None, int]] = []  # (host arrays, None if not converted; rows)
        ended = False
        sent: list[str] = []
        while True:
            tag = self.next_tag = f"e{epoch}/s{step}"
            while not ended and len(held) < self.group and not self.ctx.stop.is_set():
                table = next(it, None)
                if table is None:
                    ended = True
                elif table.num_rows < lb and self.remainder == "drop":
                    held.append((None, table.num_rows))  # dropped: never converted
                else:
                    first = (step + len(held)) * lb
                    held.append((self._host(table, epoch, first, self.ctx), table.num_rows))
            if self.ctx.stop.is_set():
                return
            full = 0
            while full < len(held) and held[full][1] == lb:
                full += 1
            got = self.agreement.exchange(tag, f"{len(held)},{full},{int(ended)}", self.ctx.stop)
            if self.agreement.process_count > 1:
                self.stats.add(agreements=1)
                sent.append(tag)
                if len(sent) > 2:  # every host has decided it: each has set a later key
                    self.agreement.forget(sent.pop(0))
            reports = [tuple(int(x) for x in v.split(",")) for v in got]
            if self.remainder == "drop":
                n = min(f for _, f, _ in reports)
                final = any(f == n and (e or f < h) for h, f, e in reports)
            else:
                live = [h for h, _, e in reports if not e]
                final = not live
                n = max(h for h, _, _ in reports) if final else min(live)
            grow = all(h == self.group and not e for h, _, e in reports)
            # A failure while delivering this round's steps is published under the next.
            self.next_tag = f"e{epoch + 1}/s0" if final else f"e{epoch}/s{step + n}"
            for _ in range(n):
                if self.ctx.stop.is_set():
                    return
                if held:
                    host, rows = held.pop(0)
                    yield self._emit(self.placement.to_global(host), epoch, step, rows)
                else:
                    yield self._emit(self._filler(), epoch, step, 0)
                step += 1
            if final:
                if self.remainder == "drop":
                    left = sum(rows for _, rows in held)
                    for t in it:  # drain to count what this host drops (not converted)
                        left += t.num_rows
                    self.stats.add(dropped_rows=left)
                if step == 0:  # every host agreed on it: all raise, none waits
                    raise self._empty_epoch(epoch, reports)
                return
            if grow:
                self.group = min(2 * self.group, self.group_max)
