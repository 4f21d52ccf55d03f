"""The commit protocol of committed datasets: put-if-absent versions, leases, cleanup, vacuum.

See docs/architecture.md, "Commit protocol". In short:

- A writer picks the version ``current + 1`` when it starts and, after all
  its shards are written, creates ``_versions/<version>.json`` with a
  conditional create (GCS ``ifGenerationMatch=0``; local disk ``os.link`` of
  a fully written temporary file, which fails if the name exists). Exactly
  one writer creates a given version; the current version is the highest
  one, so the switch is that one create. A create whose response was lost
  may be retried and answered 412 although it succeeded: the writer reads
  the object back and compares the writer id in it with its own.
- A writer holds a lease (``_leases/<writer>.json``, refreshed every few
  seconds) from before its first shard until it has committed or cleaned up.
  Shard names carry the writer id (``part-00003-<writer>.parquet``).
- Cleanup deletes only shards and sidecars that no retained version lists
  and whose writer holds no fresh lease (nor adopted them in its lease).
- :func:`vacuum` removes versions superseded longer ago than the retention
  (never the current one), then cleans up.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slicefeed.connectors._errors import CorruptManifestError, SpecError
from slicefeed.connectors._fs import (
    ResolvedPath,
    expand_paths,
    has_glob,
    is_pattern,
    resolve_filesystem,
)
from slicefeed.connectors._manifest import (
    CORRUPT_DIR,
    LEASES_DIR,
    MANIFEST_NAME,
    QUARANTINE_DIR,
    REPORTS_DIR,
    InputFile,
    Manifest,
    list_names,
    list_versions,
)

logger = logging.getLogger(__name__)

SHARD_PREFIX = "part-"
#: ``part-<task>-<writer>.parquet``: the writer id is the last dash-separated field.
_SHARD_RE = re.compile(r"^part-\d+-([A-Za-z0-9]{1,64})\.parquet$")
#: Seconds between lease refreshes / after which an unrefreshed lease is dead.
#: ``SLICEFEED_LEASE_TTL_S`` overrides the TTL (the refresh interval follows
#: at a twelfth of it, at least 0.5 s).
DEFAULT_LEASE_TTL_S = 60.0
DEFAULT_RETAIN_HOURS = 7 * 24.0


def new_writer_id() -> str:
    """A fresh writer id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def shard_writer(name: str) -> str | None:
    """The writer id in a shard's file name, or None if it is not a slicefeed shard name."""
    m = _SHARD_RE.match(name)
    return m.group(1) if m else None


def _lease_ttl() -> float:
    try:
        ttl = float(os.environ.get("SLICEFEED_LEASE_TTL_S", DEFAULT_LEASE_TTL_S))
    except ValueError:
        ttl = DEFAULT_LEASE_TTL_S
    return ttl if math.isfinite(ttl) and ttl > 0 else DEFAULT_LEASE_TTL_S


# -- writes -----------------------------------------------------------------------


def _write_durable(path: str, data: bytes) -> None:
    """Writes a local file and fsyncs it, so a rename or link of it exposes all of ``data``."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(target: ResolvedPath, data: bytes) -> None:
    """Writes ``data`` so a reader sees all of it or nothing (replacing; writer-owned files only)."""
    if target.protocol == "file":
        os.makedirs(os.path.dirname(target.path), exist_ok=True)
        tmp = f"{target.path}.tmp-{uuid.uuid4().hex}"
        _write_durable(tmp, data)
        os.replace(tmp, target.path)
    else:
        # One object PUT: GCS makes an object visible only once fully uploaded.
        target.fs.pipe_file(target.path, data)


def put_if_absent(target: ResolvedPath, data: bytes) -> None:
    """Creates ``target`` with ``data`` only if nothing exists there, atomically.

    Local disk: a fully written temporary file is hard-linked to the name
    (``link`` fails if the name exists; never a replacing rename). GCS: one
    upload with ``ifGenerationMatch=0``. Other fsspec filesystems: an
    existence check then a write, which is not atomic against another writer.

    Raises:
        FileExistsError: the object exists. On GCS this may be this process's
            own earlier attempt whose response was lost; callers that can tell
            (by the content) must read it back.
    """
    if target.protocol == "file":
        d = os.path.dirname(target.path)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".{os.path.basename(target.path)}.tmp-{uuid.uuid4().hex}")
        try:
            _write_durable(tmp, data)
            os.link(tmp, target.path)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        try:  # make the new name durable
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    elif target.protocol == "gs":
        target.fs.pipe_file(target.path, data, mode="create")
    else:
        if target.fs.exists(target.path):
            raise FileExistsError(target.uri)
        target.fs.pipe_file(target.path, data)


def _rm(fs: Any, path: str, *, recursive: bool = False) -> None:
    try:
        fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass


# -- leases -----------------------------------------------------------------------


class Lease:
    """A running writer's claim on its files: ``<prefix>/_leases/<writer>.json``.

    Refreshed every ``ttl_s / 12`` seconds by a daemon thread while held. A
    lease not refreshed for ``ttl_s`` seconds (by the clock of whoever looks)
    is dead, and the files its writer wrote become strays. :meth:`adopt`
    claims files another (dead) writer wrote, e.g. finished shards a crash
    rerun reuses, so that cleanup leaves them alone until they are committed.

    Args:
        target: The dataset prefix.
        writer_id: The writer's id (as in its shard names).
        ttl_s: Lifetime without refresh; default ``SLICEFEED_LEASE_TTL_S`` or 60 s.
    """

    def __init__(self, target: ResolvedPath, writer_id: str, *, ttl_s: float | None = None):
        self.target = target
        self.writer_id = writer_id
        self.ttl_s = float(ttl_s) if ttl_s is not None else _lease_ttl()
        self.location = target.join(LEASES_DIR, f"{writer_id}.json")
        self.adopted: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.refresh_error: BaseException | None = None
        #: Wall-clock time of the last refresh that was written (0: none yet).
        self._refreshed_at = 0.0
        #: Why this lease is no longer held, once it is not; it is never taken back.
        self._lost: str | None = None

    def _doc(self, now: float) -> bytes:
        return json.dumps({
            "writer": self.writer_id, "refreshed_at": now, "ttl_s": self.ttl_s,
            "adopted": sorted(self.adopted), "pid": os.getpid(),
        }).encode()

    def refresh(self) -> None:
        """Rewrites the lease, unless it was lost. Others judge a lease dead once
        it is ``ttl_s`` old (by their clocks) and then remove it and its writer's
        files: a lease not refreshed for that long (this process paused, storage
        out of reach) or no longer there is lost for good, never written again,
        so that a writer judged dead cannot commit files that may be gone."""
        with self._lock:
            if self._lost is not None:
                return
            now = time.time()
            if self._refreshed_at and now - self._refreshed_at >= self.ttl_s:
                self._lost = (f"this writer's lease was not refreshed for "
                              f"{now - self._refreshed_at:.0f} s (the process was paused, or "
                              f"storage was out of reach), longer than its {self.ttl_s:.0f} s "
                              "lifetime, so other writers may have removed its shards")
                return
            if self._refreshed_at and not _exists_now(self.location):
                self._lost = ("this writer's lease was removed by another writer's cleanup, "
                              "which judged it dead and may have removed its shards")
                return
            write_atomic(self.location, self._doc(now))
            self._refreshed_at = now

    def adopt(self, names: Iterable[str]) -> None:
        """Claims files (names directly in the prefix) for this writer; refreshes at once."""
        self.adopted.update(names)
        self.refresh()

    def start(self) -> Lease:
        self.refresh()
        interval = max(self.ttl_s / 12.0, 0.5)

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.refresh()
                except Exception as e:  # noqa: BLE001 - reported by held()
                    self.refresh_error = e
                    logger.warning("could not refresh lease %s: %s", self.location.uri, e)

        self._thread = threading.Thread(target=loop, name=f"slicefeed-lease-{self.writer_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def lost(self) -> str | None:
        """Why this writer no longer holds its lease (see :meth:`refresh`), or None:
        refreshed now, continuously, and still there as its own."""
        try:
            self.refresh()
        except Exception as e:  # noqa: BLE001 - a lease that cannot be written is not held
            return f"this writer's lease could not be refreshed ({type(e).__name__})"
        if self._lost is not None:
            return self._lost
        try:
            doc = json.loads(self.location.fs.cat_file(self.location.path))
        except (FileNotFoundError, ValueError):
            return "this writer's lease was removed by another writer's cleanup"
        if doc.get("writer") != self.writer_id:
            return "this writer's lease was replaced"
        return None

    def held(self) -> bool:
        """Whether this writer still holds its lease (see :meth:`lost`)."""
        return self.lost() is None

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            self._lost = self._lost or "released"
            _rm(self.location.fs, self.location.path)


def live_writers(target: ResolvedPath, *, now: float | None = None) -> tuple[set[str], set[str]]:
    """Writers whose lease is fresh, and the file names they adopted."""
    now = time.time() if now is None else now
    writers: set[str] = set()
    adopted: set[str] = set()
    ldir = target.join(LEASES_DIR)
    for name in list_names(ldir):
        doc = _fresh_lease(ldir.join(name), now)
        if doc is not None:
            writers.add(str(doc["writer"]))
            adopted.update(str(n) for n in doc.get("adopted") or ())
    return writers, adopted


def _fresh_lease(loc: ResolvedPath, now: float) -> dict | None:
    """The lease at ``loc`` if it is fresh at ``now``; None if it is stale, gone
    or cannot be read (a lease that cannot be read is not a live one)."""
    try:
        doc = json.loads(loc.fs.cat_file(loc.path))
        fresh = now - float(doc["refreshed_at"]) < float(doc["ttl_s"])
        return doc if fresh and "writer" in doc else None
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return None


# -- cleanup and vacuum ---------------------------------------------------------------


def _retained(target: ResolvedPath) -> tuple[dict[int, Manifest], list[str]]:
    """Parsed retained versions, and the URIs of those that do not parse."""
    from slicefeed.connectors._manifest import read_manifest

    out: dict[int, Manifest] = {}
    bad: list[str] = []
    for v, loc in list_versions(target).items():
        try:
            out[v] = read_manifest(target, version=v)
        except CorruptManifestError:
            bad.append(loc.uri)
        except FileNotFoundError:
            continue  # removed meanwhile
    return out, bad


def cleanup(target: ResolvedPath, *, keep_writers: Sequence[str] = ()) -> list[str]:
    """Deletes strays: shards and sidecars no retained version lists and no live writer owns.

    Only slicefeed shard names (``part-<n>-<writer>.parquet``) are ever
    deleted, never other files in the prefix. Deletes nothing while a
    retained version cannot be parsed (its file list is unknown). Dead
    writers' leases are removed too.

    Returns:
        The URIs deleted.
    """
    versions, bad = _retained(target)
    if bad:
        logger.warning("not removing strays in %s: %s cannot be parsed", target.uri, ", ".join(bad))
        return []
    listed = {f.path for m in versions.values() for f in m.files}
    sidecars = {s for m in versions.values() for s in (m.report, m.quarantine) if s}
    live, adopted = live_writers(target)
    live.update(keep_writers)
    # A writer that started after the listing of leases above holds a fresh
    # lease by the time its shards are listed: each writer's lease is read
    # again (once) before the first of its files or its lease is deleted.
    verdict: dict[str, bool] = {}

    def dead(w: str) -> bool:
        if w in live:
            return False
        if w not in verdict:
            verdict[w] = _fresh_lease(target.join(LEASES_DIR, f"{w}.json"), time.time()) is None
            if not verdict[w]:
                live.add(w)
        return verdict[w]

    names = list(list_names(target))
    # Adoptions made while the names were listed (a crash rerun claims a dead
    # writer's shards before it relies on them) count too.
    more_live, more_adopted = live_writers(target)
    live.update(more_live)
    adopted.update(more_adopted)
    removed: list[str] = []
    for name in names:
        w = shard_writer(name)
        if w is None or name in listed or name in adopted or not dead(w):
            continue
        loc = target.join(name)
        _rm(target.fs, loc.path)
        removed.append(loc.uri)
    for sub, suffix in ((REPORTS_DIR, ".json"), (QUARANTINE_DIR, "")):
        d = target.join(sub)
        for name in list_names(d):
            w = name[: -len(suffix)] if suffix and name.endswith(suffix) else name
            if (f"{sub}/{name}" in sidecars or not re.fullmatch(r"[A-Za-z0-9]{1,64}", w)
                    or not dead(w)):
                continue
            loc = d.join(name)
            _rm(target.fs, loc.path, recursive=True)
            removed.append(loc.uri)
    ldir = target.join(LEASES_DIR)
    for name in list_names(ldir):
        if name.endswith(".json") and dead(name[:-5]):
            _rm(target.fs, ldir.join(name).path)
    return removed


def _exists_now(loc: ResolvedPath) -> bool:
    """Whether ``loc`` exists, asked of the storage (not a cached listing)."""
    loc.fs.invalidate_cache(loc.path)
    return loc.fs.exists(loc.path)


def remove_own(target: ResolvedPath, writer_id: str, names: Iterable[str],
               sidecars: Iterable[str] = ()) -> None:
    """Deletes files this writer wrote (shards named with its id, its sidecars)
    and nothing else: not a shard a retained version lists or a live writer
    adopted (a rerun may have taken over the shards of this writer while it was
    judged dead, and committed them). Deletes no shard while a retained
    version cannot be parsed."""
    names = [n for n in names if shard_writer(n) == writer_id]
    if names:
        versions, bad = _retained(target)
        if bad:
            logger.warning("not removing the shards of %s in %s: %s cannot be parsed",
                           writer_id, target.uri, ", ".join(bad))
            names = []
        keep = {f.path for m in versions.values() for f in m.files} | live_writers(target)[1]
        names = [n for n in names if n not in keep]
    for name in names:
        _rm(target.fs, target.join(name).path)
    for s in sidecars:
        if s.split("/")[-1].removesuffix(".json") == writer_id:
            _rm(target.fs, target.join(s).path, recursive=True)


def set_aside(target: ResolvedPath, loc: ResolvedPath) -> str:
    """Moves an unparseable manifest to ``_corrupt/`` (copy, then delete); returns its new URI."""
    data = loc.fs.cat_file(loc.path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = target.join(CORRUPT_DIR, f"{loc.path.rsplit('/', 1)[-1]}.{stamp}-{uuid.uuid4().hex[:6]}")
    write_atomic(dest, data)
    _rm(loc.fs, loc.path)
    return dest.uri


def _parse_time(s: str) -> float | None:
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(s)
    except (TypeError, ValueError):
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


@dataclasses.dataclass
class VacuumResult:
    """What :func:`vacuum` removed."""

    uri: str
    current: int | None
    versions_removed: list[int]
    versions_kept: list[int]
    files_removed: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def vacuum(
    uri: str | ResolvedPath, *, retain_hours: float = DEFAULT_RETAIN_HOURS,
    now: float | None = None, **fs_kwargs: Any,
) -> VacuumResult:
    """Removes versions superseded more than ``retain_hours`` ago, then their files.

    A version is superseded when the next retained version was committed
    (its ``created_at``); the current version is never removed. Files are
    removed only when no retained version lists them and no live writer
    owns them.

    Raises:
        SpecError: ``retain_hours`` is negative or not finite.
        NotCommittedError: ``uri`` holds no committed dataset.
    """
    if isinstance(retain_hours, bool) or not isinstance(retain_hours, (int, float)) or not (
        math.isfinite(retain_hours) and retain_hours >= 0
    ):
        raise SpecError(f"retain_hours must be a finite number >= 0, got {retain_hours!r:.40}.")
    from slicefeed.connectors._manifest import read_manifest

    target = uri if isinstance(uri, ResolvedPath) else resolve_filesystem(uri, **fs_kwargs)
    read_manifest(target)  # NotCommittedError / CorruptManifestError for the current one
    now = time.time() if now is None else now
    cutoff = now - retain_hours * 3600.0
    versions, _ = _retained(target)
    locations = list_versions(target)
    numbers = sorted(locations)
    current = numbers[-1]
    removed: list[int] = []
    for i, v in enumerate(numbers[:-1]):
        successor = versions.get(numbers[i + 1])
        superseded_at = _parse_time(successor.created_at) if successor is not None else None
        if superseded_at is not None and superseded_at < cutoff:
            loc = locations[v]
            _rm(target.fs, loc.path)
            removed.append(v)
    files = cleanup(target)
    kept = [v for v in numbers if v not in removed]
    return VacuumResult(uri=target.uri, current=current, versions_removed=removed,
                        versions_kept=kept, files_removed=files)


# -- inputs and sink/source overlap ---------------------------------------------------


def list_inputs(sources: Sequence[tuple[str, str, dict[str, Any]]]) -> tuple[InputFile, ...]:
    """The input listing of ``(uri, format, storage kwargs)`` sources: path, size, generation.

    ``generation`` is the GCS object generation or the local mtime in ns. A
    committed-dataset source (format ``dataset``) is listed as its current
    manifest version.
    """
    from slicefeed.connectors._formats import FORMATS
    from slicefeed.connectors._manifest import current_version, version_name

    out: list[InputFile] = []
    for uri, fmt, storage in sources:
        r = resolve_filesystem(uri, **storage)
        if fmt == "dataset":
            v = current_version(r)
            name = version_name(v) if v is not None else MANIFEST_NAME
            out.append(InputFile(r.join(name).uri, None, None if v is None else str(v)))
            continue
        # The files a run reads: a folder's files named for its format.
        paths = expand_paths(r, suffixes=FORMATS[fmt].listing_suffixes if fmt in FORMATS else ())
        # One detailed listing instead of a metadata request per file.
        try:
            if is_pattern(r.fs, r.path):
                listed = r.fs.glob(r.path, detail=True)
            elif r.fs.isdir(r.path):
                listed = r.fs.find(r.path, detail=True)
            else:
                listed = {}
        except (OSError, ValueError):
            listed = {}
        for p in paths:
            size, gen = size_generation(r, p, listed.get(p) or r.fs.info(p))
            out.append(InputFile(r.to_uri(p), size, gen))
    return tuple(out)


def size_generation(r: ResolvedPath, path: str, info: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """``(size, generation)`` of a listed file: the GCS object generation, or
    the local mtime in ns (another store's modification time otherwise)."""
    gen = info.get("generation")
    if gen is None and r.protocol == "file":
        gen = os.stat(path).st_mtime_ns
    elif gen is None:
        gen = info.get("mtime") or info.get("updated") or info.get("LastModified")
    size = info.get("size")
    return (int(size) if size is not None else None), (None if gen is None else str(gen))


def list_folder(uri: str, *, exclude: Sequence[str] = (), **storage: Any) -> tuple[InputFile, ...]:
    """Every file under a folder a transform reads from, as listed now.

    One recursive listing (no file is opened): each file's path relative to
    the folder, size and generation as in :func:`list_inputs`, sorted by path.
    Hidden and underscore-prefixed files count too (a transform may read any
    file under the folder). A folder that does not exist lists as empty.
    Files under an ``exclude`` prefix inside the folder (the run's own sink,
    which every commit changes) are left out.
    """
    proto, head, _ = _lexical(uri)
    skip = []
    for ex in exclude:
        ex_proto, ex_head, _ = _lexical(ex)
        if ex_proto == proto and ex_head[: len(head)] == head and len(ex_head) > len(head):
            skip.append("/".join(ex_head[len(head):]))
    r = resolve_filesystem(uri, **storage)
    base = r.path.rstrip("/")
    # A listing cached by this filesystem instance may predate a change.
    r.fs.invalidate_cache(base)
    try:
        listed = r.fs.find(base, detail=True) if r.fs.isdir(base) else {}
    except FileNotFoundError:
        listed = {}
    out = []
    for p, info in listed.items():
        if info.get("type") == "directory":
            continue
        rel = p[len(base):].lstrip("/")
        if any(rel == k or rel.startswith(k + "/") for k in skip):
            continue
        size, gen = size_generation(r, p, info)
        out.append(InputFile(rel, size, gen))
    return tuple(sorted(out, key=lambda f: f.uri))


def _lexical(uri: str) -> tuple[str, list[str], list[str]]:
    """A URI as (protocol, glob-free leading components, the rest); no storage access.

    ``file://`` and plain paths become absolute with ``..`` and symlinks
    resolved in the glob-free part; other URIs are normalised lexically
    (``gcs://`` is ``gs://``; trailing slashes and ``..`` resolved).
    """
    import posixpath

    from slicefeed.connectors._fs import _split_protocol

    protocol, rest = _split_protocol(os.fspath(uri))
    if protocol == "gcs":
        protocol = "gs"
    if protocol == "file":
        parts = os.path.abspath(os.path.expanduser(rest)).split("/")
        k = next((i for i, p in enumerate(parts) if has_glob(p)), len(parts))
        head = os.path.realpath("/".join(parts[:k]) or "/")
        return protocol, [p for p in head.split("/") if p], [p for p in parts[k:] if p]
    norm = posixpath.normpath("/" + rest.strip("/")).lstrip("/")
    parts = [p for p in norm.split("/") if p]
    k = next((i for i, p in enumerate(parts) if has_glob(p)), len(parts))
    return protocol, parts[:k], parts[k:]


def overlaps(sink: str, source: str) -> bool:
    """Whether a sink prefix equals, contains or lies inside what a source reads.

    Lexical, after resolving ``file://``, ``..``, trailing slashes and (local)
    symlinks. A source glob reads the files its pattern matches: the sink
    conflicts if it contains the glob's fixed leading folder, or if it lies
    inside it where the pattern could match the sink, a folder holding it, or
    a file under it (``**`` matches anywhere).
    """
    import fnmatch

    s_proto, sk, _ = _lexical(sink)
    r_proto, src_head, src_rest = _lexical(source)
    if s_proto != r_proto:
        return False
    if sk[: len(src_head)] != src_head:
        # Not inside the source's fixed folder: a conflict only if it contains it.
        return src_head[: len(sk)] == sk
    below = sk[len(src_head):]
    if not below or not src_rest or any("**" in p for p in src_rest):
        return True
    # The pattern matches paths exactly len(src_rest) deep. Deeper than the
    # sink: it may match files under it; as deep or shallower: the sink or a
    # folder holding it. Either way only if the leading components match.
    return all(fnmatch.fnmatchcase(b, p) for b, p in zip(below, src_rest))


def check_sink_outside_sources(
    sink: str, sources: Sequence[str], *, where: str = "pipeline spec",
) -> None:
    """Refuses a sink that equals, contains or lies inside a source.

    A commit removes stray files in its sink and an overwrite replaces what
    the sink holds, so a sink overlapping a source could destroy the input
    it reads.

    Raises:
        SpecError: naming both URIs.
    """
    for uri in sources:
        if overlaps(sink, uri):
            raise SpecError(
                f"{where}: sink.uri {sink!r:.300} overlaps source {uri!r:.300} (it is the same folder, "
                "inside it, or contains it). A committed sink must not hold its own input: "
                "write to a separate prefix."
            )
