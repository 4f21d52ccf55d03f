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
    out = []
    pos = 0
    for i in order:
        path, ulo, uhi = units[i]
        n = uhi - ulo
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            out.append((path, ulo + lo, ulo + hi))
        pos += n
        if pos >= stop:
            break
    return out


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
