"""Opening committed shards on object storage without asking the store what the
manifest already says.

A committed manifest records every shard's size, so reading a shard needs no
``stat``: the footer is one ranged read of the file's last bytes (cached per
process, so a shard read by several windows or epochs costs it once), and the
row groups a window needs are ranged reads of their column chunks, coalesced and
split into parts fetched concurrently (one connection each), so a first-byte
delay is paid once per run of windows rather than once per request in a row. A shard
of another size than the manifest's is still caught: its last bytes are not a
Parquet footer where the manifest says the file ends, and only then is the store
asked for the real size, to name it in the error.

Local files are opened as before: the operating system already does this.
"""

from __future__ import annotations

import bisect
import collections
import io
import threading
from concurrent.futures import CancelledError
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: Bytes read from a shard's end to get its footer in one request (most footers
#: are a few KiB; a longer one costs a second read).
FOOTER_READ = 64 << 10
#: Column-chunk ranges closer than this are read as one range.
COALESCE_GAP = 1 << 20
#: Ranges are split into parts of at most this size, fetched concurrently: a
#: store serves each connection at a limited rate.
PART_BYTES = 4 << 20
#: Footers kept per process (a footer is a few KiB to a few hundred KiB).
FOOTER_CACHE_ENTRIES = 512

_footers: collections.OrderedDict[tuple, pq.FileMetaData] = collections.OrderedDict()
_lock = threading.Lock()


def is_remote(fs: Any) -> bool:
    """Whether ``fs`` is object storage (ranged reads) rather than a local disk."""
    protocol = getattr(fs, "protocol", "file")
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return not {"file", "local"} & set(protocols)


def _mismatch(fs: Any, path: str, size: int, why: str) -> Exception:
    from slicefeed.connectors import CorruptFileError, ShardMismatchError

    try:  # only on this error path: ask for the real size to name it
        actual = int(fs.info(path)["size"])
    except (OSError, KeyError, ValueError):
        actual = None
    if actual is not None and actual != size:
        return ShardMismatchError(
            f"{path}: {actual} bytes, the manifest says {size}. The shard was replaced "
            "or truncated after the commit; rewrite the dataset with --overwrite.")
    return CorruptFileError(f"{path}: not a readable Parquet file ({why}).")


def gone(path: str, version: int | None) -> Exception:
    """The error for a shard its manifest lists that is no longer there: what
    removes such files, and what to do."""
    from slicefeed.connectors import ShardMismatchError

    which = ("the committed dataset's manifest" if version is None
             else f"version {version} of the committed dataset")
    return ShardMismatchError(
        f"{path}: listed by {which}, but gone. `slicefeed vacuum` removes the files of "
        "versions superseded longer than --retain-hours ago, also while a loader still "
        "reads them; restart the loader to read the current version, and give vacuum a "
        "--retain-hours longer than a run reads one version.")


def footer(fs: Any, path: str, size: int) -> pq.FileMetaData:
    """The Parquet footer of the ``size``-byte object at ``path`` (cached per process)."""
    key = (*_key(fs, path), size)
    with _lock:
        md = _footers.get(key)
        if md is not None:
            _footers.move_to_end(key)
            return md
    start = max(0, size - FOOTER_READ)
    tail = _cat(fs, path, start, size)
    if len(tail) != size - start or tail[-4:] != b"PAR1":
        raise _mismatch(fs, path, size, "no Parquet footer where the manifest says it ends")
    n = int.from_bytes(tail[-8:-4], "little") + 8
    if n > size - 4:
        raise _mismatch(fs, path, size, f"footer of {n} bytes in a {size}-byte file")
    if n > len(tail):
        tail = _cat(fs, path, size - n, size - len(tail)) + tail
    try:
        md = pq.read_metadata(pa.BufferReader(tail))
    except (pa.ArrowException, OSError) as e:
        raise _mismatch(fs, path, size, str(e)[:200]) from None
    with _lock:
        _footers[key] = md
        while len(_footers) > FOOTER_CACHE_ENTRIES:
            _footers.popitem(last=False)
    return md


def _cat(fs: Any, path: str, start: int, end: int) -> bytes:
    try:
        return fs.cat_file(path, start=start, end=end)
    except FileNotFoundError:
        raise
    except OSError as e:  # e.g. 416 Range Not Satisfiable: the object is shorter
        if "416" in str(e) or "satisfiable" in str(e).lower():
            return b""
        raise


def run_spans(windows: list[dict], path: str) -> tuple[tuple[int, int], ...]:
    """The row ranges a run of windows (``{"pieces": [(path, lo, hi), ...]}``)
    reads from the shard ``path``."""
    return tuple((lo, hi) for w in windows for p, lo, hi in w["pieces"] if p == path)


def groups_for(md: pq.FileMetaData, spans: tuple[tuple[int, int], ...]) -> list[int]:
    """The row groups overlapping any of ``spans`` (row ranges of the file)."""
    out, pos = [], 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if any(pos + n > lo and pos < hi for lo, hi in spans):
            out.append(g)
        pos += n
    return out


def chunk_ranges(md: pq.FileMetaData, groups: list[int], columns: list[str] | None
                 ) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of the column chunks of ``groups`` (top-level
    ``columns``; None: all), coalesced across gaps below :data:`COALESCE_GAP`."""
    wanted = None if columns is None else set(columns)
    spans = []
    for g in groups:
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if wanted is not None and col.path_in_schema.split(".", 1)[0] not in wanted:
                continue
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, start + col.total_compressed_size))
    spans.sort()
    out: list[list[int]] = []
    for s, e in spans:
        if out and s - out[-1][1] <= COALESCE_GAP:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _parts(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    parts = []
    for s, e in ranges:
        k = max(1, -(-(e - s) // PART_BYTES))
        step = -(-(e - s) // k)
        parts.extend((a, min(a + step, e)) for a in range(s, e, step))
    return parts


class _SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are held (a
    read spanning adjacent held ranges is joined); a read elsewhere is fetched
    from the store (pyarrow reads only the column chunks its footer names, so
    that happens only if the prefetch missed something)."""

    def __init__(self, fs: Any, path: str, size: int, ranges: dict[int, bytes]):
        self.fs, self.path, self.size = fs, path, size
        self.starts = sorted(ranges)
        self.blocks = [ranges[s] for s in self.starts]
        self.pos = 0

    def twin(self) -> _SparseFile:
        """The same held bytes (shared, not copied) at a position of its own: a
        file object has one position, so each reading thread needs its own."""
        out = _SparseFile(self.fs, self.path, self.size, {})
        out.starts, out.blocks = self.starts, self.blocks
        return out

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        start = self.pos
        self.pos = max(end, start)
        if end <= start:
            return b""
        i = bisect.bisect_right(self.starts, start) - 1
        out, at = [], start
        while 0 <= i < len(self.starts) and self.starts[i] <= at < end:
            b, s = self.blocks[i], self.starts[i]
            if at >= s + len(b):
                break
            # A view, not a copy: pyarrow holds what it reads while it decodes.
            out.append(memoryview(b)[at - s:min(end, s + len(b)) - s])
            at = min(end, s + len(b))
            i += 1
        if at < end:
            out.append(_cat(self.fs, self.path, at, end))
        return out[0] if len(out) == 1 else b"".join(out)

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _key(fs: Any, path: str) -> tuple:
    # The same path through another endpoint or credentials is another object.
    options = repr(sorted((getattr(fs, "storage_options", None) or {}).items()))
    return (type(fs).__qualname__, options, path)


def _fetch(fs: Any, path: str, parts: list[tuple[int, int]]) -> list[bytes]:
    if not parts:
        return []
    data = fs.cat_ranges([path] * len(parts), [s for s, _ in parts], [e for _, e in parts],
                         on_error="return")
    for b in data:
        if isinstance(b, BaseException):
            raise b
    return data


class FetchAhead:
    """Fetches the column-chunk bytes of upcoming runs while earlier ones decode,
    so a store's first-byte delay overlaps useful work. Bytes fetched here are
    taken (once) by :func:`open_shard` in the same process; what is never taken
    is dropped by :meth:`close`."""

    def __init__(self, workers: int):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="slicefeed-fetch")
        self._keys: list[tuple] = []

    def submit(self, fs: Any, path: str, size: int, spans: tuple[tuple[int, int], ...],
               columns: list[str] | None) -> None:
        """Starts fetching the row groups of the shard at ``path`` that ``spans`` overlap."""
        key = _ahead_key(fs, path, spans, columns)
        with _lock:
            if key in _ahead:
                return
            _ahead[key] = self._pool.submit(_get, fs, path, size, spans, columns)
        self._keys.append(key)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with _lock:
            for k in self._keys:
                _ahead.pop(k, None)
        self._keys.clear()


def _ahead_key(fs, path, spans, columns) -> tuple:
    return (*_key(fs, path), tuple(spans), tuple(columns) if columns is not None else None)


def _get(fs, path, size, spans, columns) -> tuple[list[tuple[int, int]], list[bytes]]:
    md = footer(fs, path, size)
    parts = _parts(chunk_ranges(md, groups_for(md, spans), columns))
    return parts, _fetch(fs, path, parts)


#: Fetches started by a :class:`FetchAhead`, by (filesystem, path, rows, columns).
_ahead: dict[tuple, Any] = {}


def open_shard(fs: Any, path: str, expect: list[int], spans: tuple[tuple[int, int], ...],
               columns: list[str] | None) -> tuple[pq.ParquetFile, Any]:
    """The committed shard at ``path`` (``expect``: the manifest's ``[num_rows,
    num_bytes]``) as a ``ParquetFile`` holding in memory the column chunks of the
    row groups ``spans`` overlap: the footer (cached) and those chunks in
    concurrent ranged reads, or taken from a :class:`FetchAhead` that started them.
    Also a function giving another file of the same held bytes at a position of
    its own (:meth:`_SparseFile.twin`), for another thread to read.

    Raises:
        ShardMismatchError: the shard's size or row count is not the manifest's.
    """
    from slicefeed.connectors import ShardMismatchError

    rows, size = int(expect[0]), int(expect[1])
    md = footer(fs, path, size)
    if md.num_rows != rows:
        raise ShardMismatchError(
            f"{path}: {md.num_rows} rows, the manifest says {rows}. The shard was "
            "replaced after the commit; rewrite the dataset with --overwrite.")
    with _lock:
        ahead = _ahead.pop(_ahead_key(fs, path, spans, columns), None)
    if ahead is not None:
        try:
            parts, data = ahead.result()
        except CancelledError:
            # Its FetchAhead closed (an epoch ended) after this reader, of another
            # epoch reading the same rows, took it: read the bytes here.
            ahead = None
    if ahead is None:
        parts = _parts(chunk_ranges(md, groups_for(md, spans), columns))
        data = _fetch(fs, path, parts)
    held: dict[int, bytes] = {}
    for (s, e), b in zip(parts, data):
        if len(b) != e - s:
            raise _mismatch(fs, path, size, f"bytes {s}-{e} read as {len(b)} bytes")
        held[s] = b
    sparse = _SparseFile(fs, path, size, held)
    return pq.ParquetFile(sparse, metadata=md), sparse.twin
