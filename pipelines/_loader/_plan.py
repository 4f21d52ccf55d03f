"""Pure planning: host shares, equal steps, read windows. No I/O, no Ray, no JAX.

Everything here is a function of integers, file sizes and seeds, so every host
computes the same plan without talking to the others (and the functions are
property-tested).
"""

from __future__ import annotations

import numpy as np

# A piece of a host's share: rows [lo, hi) of one file.
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


def epoch_file_order(num_files: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of a committed dataset's files in ``epoch``."""
    if not shuffle:
        return np.arange(num_files)
    return np.random.default_rng([seed, epoch, 0x5F]).permutation(num_files)


def pieces(files: list[tuple[str, int]], order: np.ndarray, start: int, stop: int) -> list[Piece]:
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


def windows(share: list[Piece], window_rows: int) -> list[list[Piece]]:
    """Splits a host share into consecutive windows of ``window_rows`` rows."""
    out: list[list[Piece]] = []
    cur: list[Piece] = []
    room = window_rows
    for path, lo, hi in share:
        while lo < hi:
            take = min(hi - lo, room)
            cur.append((path, lo, lo + take))
            lo += take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], window_rows
    if cur:
        out.append(cur)
    return out


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


def locate(share: list[Piece], window_rows: int, row: int, rng: list[int] | None) -> Piece:
    """The file and row of the ``row``-th row a host delivers in an epoch, for error
    messages: ``(path, file_row, file_row + 1)``. ``rng`` is the window's seed
    when shuffled (:func:`window_rng` of window ``row // window_rows``), else None."""
    ws = windows(share, window_rows)
    k, pos = divmod(row, window_rows)
    w = ws[k]
    if rng is not None:
        pos = int(window_permutation(rng, sum(hi - lo for _, lo, hi in w))[pos])
    for path, lo, hi in w:
        if pos < hi - lo:
            return (path, lo + pos, lo + pos + 1)
        pos -= hi - lo
    raise IndexError(row)  # pragma: no cover - row outside the share
