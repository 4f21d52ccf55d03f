"""Pure planning: host shares, equal steps, read windows. No I/O, no Ray, no JAX.

A committed dataset is read in units of whole Parquet row groups: an epoch is
the row groups in a (seeded, per-epoch) order; each host owns a contiguous row
range of that stream; a host's share is cut into windows of whole row groups,
and a row group larger than a window is streamed in window-sized chunks.

Everything here is a function of integers, file sizes and seeds, so every host
computes the same plan without talking to the others (and the functions are
property-tested).
"""

from __future__ import annotations

import dataclasses

import numpy as np

# A piece of a host's share: rows [lo, hi) of one file, inside one read unit.
Piece = tuple[str, int, int]


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


def nothing_to_load(
    hosts: int,
    local_batch_size: int,
    remainder: str,
    *,
    any_rows: bool,
    smallest_share: int | None = None,
    epoch: int | None = None,
) -> str:
    """The one message for a source that gives no step, whether that is known at
    construction (row counts known) or only at the end of an epoch (unknown
    counts, so ``smallest_share`` is None)."""
    where = "the source" if epoch is None else f"epoch {epoch} of the source"
    if remainder == "drop" and any_rows:
        share = ("a host's share has fewer rows than" if smallest_share is None else
                 f"the smallest host share has {smallest_share} rows, fewer than")
        return (f"JaxLoader: {where}: with remainder='drop' no full batch fits: {share} "
                f"the local batch ({local_batch_size}); use a smaller global_batch_size "
                "or remainder='pad'.")
    return (f"JaxLoader: {where} has no rows (0 rows on all {hosts} host(s)), so there is "
            f"nothing to load with remainder={remainder!r}; check the dataset (an empty "
            "directory or split, or filters that removed every row).")


def delivered_rows(share: int, steps: int, local_batch_size: int, remainder: str) -> int:
    """Rows of a host's share that are read at all: with ``"drop"`` only the rows
    of the agreed steps (the rest is counted as dropped, never read)."""
    if remainder == "drop":
        return min(share, steps * local_batch_size)
    return share


def read_units(files: list[tuple[str, int, tuple[int, ...]]]) -> list[Piece]:
    """The read units of a committed dataset, in file order: one per Parquet row
    group, ``(path, lo, hi)`` rows of a file, from each file's
    ``(path, num_rows, row_group_rows)``; a file whose row groups are not
    recorded (an older manifest) is one unit."""
    out: list[Piece] = []
    for path, n, groups in files:
        if not groups:
            out.append((path, 0, n))
            continue
        lo = 0
        for g in groups:
            if g:
                out.append((path, lo, lo + g))
            lo += g
    return out


def epoch_unit_order(num_units: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of a committed dataset's read units (row groups) in ``epoch``:
    a fresh permutation per epoch when shuffling."""
    if not shuffle:
        return np.arange(num_units)
    return np.random.default_rng([seed, epoch, 0x5F]).permutation(num_units)


def pieces(units: list[Piece], order: np.ndarray, start: int, stop: int) -> list[Piece]:
    """Row range ``[start, stop)`` of the epoch's unit stream (``units`` in
    ``order``) as (path, lo, hi) pieces, each inside one unit."""
    return slice_pieces([units[i] for i in order], start, stop)


def _cut(share: list[Piece], window_rows: int) -> list[tuple[list[Piece], int | None]]:
    """Windows of ``share`` with, for a chunk of a cut piece, the piece's index."""
    out: list[tuple[list[Piece], int | None]] = []
    cur: list[Piece] = []
    room = window_rows
    for i, (path, lo, hi) in enumerate(share):
        n = hi - lo
        if n > window_rows:
            if cur:
                out.append((cur, None))
                cur, room = [], window_rows
            out += [([(path, a, min(a + window_rows, hi))], i)
                    for a in range(lo, hi, window_rows)]
            continue
        if n > room:
            out.append((cur, None))
            cur, room = [], window_rows
        cur.append((path, lo, hi))
        room -= n
    if cur:
        out.append((cur, None))
    return out


def windows(share: list[Piece], window_rows: int) -> list[list[Piece]]:
    """Cuts a host share into read windows of at most ``window_rows`` rows made
    of whole pieces (row groups, or the part of one a host owns); a piece larger
    than a window is cut into ``window_rows`` chunks, one window each, which
    :func:`read_runs` reads as one stream."""
    return [w for w, _ in _cut(share, window_rows)]


def read_runs(share: list[Piece], window_rows: int) -> list[tuple[int, int]]:
    """``[first, stop)`` window indices read together: the chunks of one cut
    piece (one decoding stream, so nothing is decoded twice); a single window
    otherwise."""
    out: list[tuple[int, int]] = []
    prev = None
    for k, (_, cut) in enumerate(_cut(share, window_rows)):
        if out and cut is not None and cut == prev:
            out[-1] = (out[-1][0], k + 1)
        else:
            out.append((k, k + 1))
        prev = cut
    return out


def window_starts(ws: list[list[Piece]]) -> np.ndarray:
    """First row (within the share) of each window, plus the share's size."""
    return np.cumsum([0] + [sum(hi - lo for _, lo, hi in w) for w in ws])


def find_window(ws: list[list[Piece]], row: int) -> tuple[int, int]:
    """``(window, row within it)`` of the share's ``row``-th row; ``(len(ws), 0)``
    past the end."""
    starts = window_starts(ws)
    if row >= starts[-1]:
        return len(ws), 0
    k = int(np.searchsorted(starts, row, side="right")) - 1
    return k, row - int(starts[k])


def skip_pieces(share: list[Piece], skip: int) -> list[Piece]:
    """``share`` without its first ``skip`` rows."""
    out = []
    for p, lo, hi in share:
        n = hi - lo
        if skip >= n:
            skip -= n
            continue
        out.append((p, lo + skip, hi))
        skip = 0
    return out


def window_rng(seed: int, epoch: int, process_index: int, window: int) -> list[int]:
    """The seed of one window's row permutation."""
    return [seed, epoch, process_index, window]


def window_permutation(rng: list[int], rows: int) -> np.ndarray:
    """The order in which a shuffled window delivers its rows (indices into the
    concatenation of its pieces)."""
    return np.random.default_rng(rng).permutation(rows)


def window_size(
    *, shuffle: bool, shuffle_buffer_rows: int, bytes_per_row: float, target_bytes: int,
    local_batch_size: int,
) -> int:
    """Rows per read window: ``shuffle_buffer_rows`` when shuffling, else about
    ``target_bytes`` of decoded rows; a multiple of the local batch, at least one batch."""
    lb = local_batch_size
    rows = shuffle_buffer_rows if shuffle else int(target_bytes // max(bytes_per_row, 1))
    return max(lb, -(-rows // lb) * lb)


def locate(share: list[Piece], window_rows: int, row: int, rng_of=None) -> Piece:
    """The file and row of the ``row``-th row a host delivers in an epoch, for error
    messages: ``(path, file_row, file_row + 1)``. ``rng_of(k)`` is window ``k``'s
    seed (:func:`window_rng`) when shuffled, else None."""
    ws = windows(share, window_rows)
    k, pos = find_window(ws, row)
    w = ws[k]
    if rng_of is not None:
        pos = int(window_permutation(rng_of(k), sum(hi - lo for _, lo, hi in w))[pos])
    for path, lo, hi in w:
        if pos < hi - lo:
            return (path, lo + pos, lo + pos + 1)
        pos -= hi - lo
    raise IndexError(row)  # pragma: no cover - row outside the share


# --------------------------------------------------------------------------- elastic resume
#
# A committed dataset's epoch can be resumed on a different number of hosts.
# Each host's epoch is described as a list of spans (rows of read windows in
# delivery order). After some steps, what every host has left is concatenated
# in host order and re-split into balanced shares for the new hosts; the spans
# keep the windows and permutations they had, so no row is delivered twice and
# none is lost. Each change of host count (or local batch, or window size)
# within an epoch is a *stage*; a state records the earlier stages of its epoch.


@dataclasses.dataclass(frozen=True)
class Span:
    """Rows ``[lo, hi)`` of one read window in delivery order: the window's rows
    (its pieces concatenated) permuted by ``window_permutation(rng, ...)`` when
    ``rng`` is set, else in piece order. Unshuffled spans are kept trimmed
    (``lo == 0``, ``hi`` = rows of the pieces), so reading one reads only its rows."""

    pieces: tuple[Piece, ...]
    rng: tuple[int, ...] | None
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclasses.dataclass(frozen=True)
class Stage:
    """Part of an epoch taken on one host layout: ``steps`` steps of
    ``local_batch_size`` rows on each of ``process_count`` hosts, windows of
    ``window_rows`` (only the epoch's first stage cuts windows; later stages
    read the spans they inherit)."""

    process_count: int
    local_batch_size: int
    window_rows: int
    steps: int


@dataclasses.dataclass(frozen=True)
class ElasticEpoch:
    """One host's resumed epoch: the spans it delivers (already cut to the rows
    it delivers), the steps every host takes, and this host's share (rows it
    delivers or drops)."""

    spans: tuple[Span, ...]
    steps: int
    share: int


def slice_pieces(share: list[Piece] | tuple[Piece, ...], start: int, stop: int) -> list[Piece]:
    """Rows ``[start, stop)`` of the concatenation of ``share``."""
    out = []
    pos = 0
    for p, lo, hi in share:
        n = hi - lo
        a, b = max(start - pos, 0), min(stop - pos, n)
        if a < b:
            out.append((p, lo + a, lo + b))
        pos += n
        if pos >= stop:
            break
    return out


def span_order(span: Span) -> np.ndarray:
    """Indices into the concatenation of ``span.pieces``, in delivery order."""
    if span.rng is None:
        return np.arange(span.lo, span.hi)
    total = sum(hi - lo for _, lo, hi in span.pieces)
    return window_permutation(list(span.rng), total)[span.lo:span.hi]


def _span(pieces: list[Piece] | tuple[Piece, ...], rng, lo: int, hi: int) -> Span:
    if rng is None:  # unshuffled: keep only the rows it delivers
        return Span(tuple(slice_pieces(pieces, lo, hi)), None, 0, hi - lo)
    return Span(tuple(pieces), tuple(rng), lo, hi)


def cut_spans(spans: list[Span] | tuple[Span, ...], start: int, stop: int) -> list[Span]:
    """Rows ``[start, stop)`` of the delivery stream of ``spans``."""
    out = []
    pos = 0
    for s in spans:
        a, b = max(start - pos, 0), min(stop - pos, s.rows)
        if a < b:
            out.append(_span(s.pieces, s.rng, s.lo + a, s.lo + b))
        pos += s.rows
        if pos >= stop:
            break
    return out


def spans_rows(spans: list[Span] | tuple[Span, ...]) -> int:
    return sum(s.rows for s in spans)


def host_spans(
    units: list[Piece],
    *,
    process_count: int,
    process_index: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    window_rows: int,
    limit: int | None,
) -> list[Span]:
    """A host's whole epoch as spans, as the unresumed plan delivers it: the
    windows of its share (cut at ``limit`` rows, the rows of the agreed steps),
    then the rest of the share (rows the plan drops) in epoch order.

    Must describe exactly what ``ManifestSource.tables`` reads without spans
    (same share, windows and window seeds); change the two together
    (``test_host_spans_deliver_what_the_unresumed_plan_delivers`` and the
    exactly-once resume tests check it)."""
    num_rows = sum(hi - lo for _, lo, hi in units)
    order = epoch_unit_order(len(units), seed, epoch, shuffle)
    start, stop = host_shares(num_rows, process_count)[process_index]
    cut = stop if limit is None else min(stop, start + limit)
    out = []
    for k, w in enumerate(windows(pieces(units, order, start, cut), window_rows)):
        rows = sum(hi - lo for _, lo, hi in w)
        rng = window_rng(seed, epoch, process_index, k) if shuffle else None
        out.append(_span(w, rng, 0, rows))
    if cut < stop:
        tail = pieces(units, order, cut, stop)
        out.append(_span(tail, None, 0, stop - cut))
    return out


def resplit(rest: list[list[Span]], process_count: int) -> list[list[Span]]:
    """What the old hosts have left (host order, each in its delivery order) as
    balanced shares of ``process_count`` new hosts."""
    flat = [s for spans in rest for s in spans]
    total = spans_rows(flat)
    return [cut_spans(flat, a, b) for a, b in host_shares(total, process_count)]


def stage_spans(
    units: list[Piece],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    remainder: str,
    stages: list[Stage],
    process_count: int,
) -> list[list[Span]]:
    """Every host's spans (undelivered rows included) for the stage that follows
    ``stages`` (the epoch's earlier stages, oldest first; at least one), on
    ``process_count`` hosts.

    Raises:
        ValueError: a stage took more steps than its plan has.
    """
    first = stages[0]
    num_rows = sum(hi - lo for _, lo, hi in units)
    shares = [b - a for a, b in host_shares(num_rows, first.process_count)]
    steps = steps_for(shares, first.local_batch_size, remainder)
    lists = [
        host_spans(
            units, process_count=first.process_count, process_index=h, seed=seed,
            epoch=epoch, shuffle=shuffle, window_rows=first.window_rows,
            limit=delivered_rows(shares[h], steps, first.local_batch_size, remainder),
        )
        for h in range(first.process_count)
    ]
    for i, st in enumerate(stages):
        lb = st.local_batch_size
        sizes = [spans_rows(spans) for spans in lists]
        steps = steps_for(sizes, lb, remainder)
        if st.steps > steps:
            raise ValueError(
                f"stage {i} took {st.steps} steps, but its plan has {steps} "
                f"({st.process_count} hosts x {lb} rows)"
            )
        rest = [
            cut_spans(spans, min(st.steps * lb, delivered_rows(n, steps, lb, remainder)), n)
            for spans, n in zip(lists, sizes)
        ]
        nxt = stages[i + 1].process_count if i + 1 < len(stages) else process_count
        lists = resplit(rest, nxt)
    return lists


def elastic_epoch(
    units: list[Piece],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    remainder: str,
    stages: list[Stage],
    process_count: int,
    process_index: int,
    local_batch_size: int,
) -> ElasticEpoch:
    """This host's part of the rest of ``epoch`` after ``stages``: every row the
    earlier stages did not deliver goes to exactly one host, the hosts' shares
    differ by at most one row, and all hosts take the same number of steps."""
    lists = stage_spans(
        units, seed=seed, epoch=epoch, shuffle=shuffle, remainder=remainder,
        stages=stages, process_count=process_count,
    )
    sizes = [spans_rows(spans) for spans in lists]
    steps = steps_for(sizes, local_batch_size, remainder)
    mine = sizes[process_index]
    keep = delivered_rows(mine, steps, local_batch_size, remainder)
    return ElasticEpoch(tuple(cut_spans(lists[process_index], 0, keep)), steps, mine)


def locate_span(spans: list[Span] | tuple[Span, ...], row: int) -> Piece:
    """The file and row of the ``row``-th delivered row of ``spans``:
    ``(path, file_row, file_row + 1)``."""
    for s in spans:
        if row < s.rows:
            pos = int(span_order(s)[row])
            for path, lo, hi in s.pieces:
                if pos < hi - lo:
                    return (path, lo + pos, lo + pos + 1)
                pos -= hi - lo
        row -= s.rows
    raise IndexError(row)  # pragma: no cover - row outside the spans
