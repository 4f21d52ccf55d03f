"""Committed datasets: the versioned manifest format.

A committed dataset is a prefix holding Parquet shards and, written last, an
immutable manifest *version* listing every shard. Readers go through a
manifest only, so files left by a crashed run are never read, and a prefix
without a manifest is not a dataset. Layout::

    <prefix>/part-00000-<writer>.parquet      shards; the writer id is in the name
    <prefix>/_versions/00000000000000000001.json
    <prefix>/_versions/00000000000000000002.json   the current version: the highest
    <prefix>/_reports/<writer>.json            a run's report (named by its manifest)
    <prefix>/_quarantine/<writer>/...          a run's bad records (named by its manifest)
    <prefix>/_leases/<writer>.json             a running writer's lease
    <prefix>/_report.json                      copy of the latest committed run's report
    <prefix>/_manifest.json                    a version-1 dataset (read as version 1)

Each version file is created put-if-absent (see :mod:`._commit` and
docs/architecture.md, "Commit protocol"); none is ever rewritten.

Format ``slicefeed.dataset/v2``::

    {
      "format": "slicefeed.dataset/v2",
      "version": 2,                    # equals the file name's number
      "parent": 1,                     # the current version when the writer started, or null
      "writer": "<writer id>",         # who created this version
      "created_at": "2026-11-29T14:00:00+00:00",
      "fingerprint": "<sha256 of the producing pipeline, or null>",
      "inputs": [{"uri": "gs://b/raw/a.jsonl", "size": 123, "generation": "1701..."}] | null,
      "num_rows": 1000, "num_bytes": 123456,
      "schema": "<base64 Arrow IPC schema>",
      "columns": {"tokens": "fixed_size_list<item: int32>[2048]", ...},
      "files": [{"path": "part-00000-<writer>.parquet", "num_rows": 500,
                 "num_bytes": 61728, "sha256": "...", "row_groups": [500],
                 "writer": "<writer id>"}, ...],
      "report": "_reports/<writer>.json" | null,
      "quarantine": "_quarantine/<writer>" | null,
      "metadata": {...}                # free-form: fit statistics, run id, versions
    }

Every file ``path`` is a plain file name directly inside the prefix.
Version-1 manifests (``_manifest.json``, ``format: slicefeed.dataset/v1``)
have no version, parent, writer, inputs, row groups, report or quarantine;
they read as version 1.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
import re
from typing import Any

import pyarrow as pa

from slicefeed.connectors import _compat
from slicefeed.connectors._errors import CorruptManifestError, NotCommittedError
from slicefeed.connectors._fs import ResolvedPath, resolve_filesystem

#: A version-1 dataset's manifest (read as version 1).
MANIFEST_NAME = "_manifest.json"
#: Copy of the latest committed run's report (the manifest names the authoritative one).
REPORT_NAME = "_report.json"
VERSIONS_DIR = "_versions"
REPORTS_DIR = "_reports"
QUARANTINE_DIR = "_quarantine"
LEASES_DIR = "_leases"
#: Where an overwrite keeps a manifest it could not parse.
CORRUPT_DIR = "_corrupt"
FORMAT_V1 = "slicefeed.dataset/v1"
FORMAT = "slicefeed.dataset/v2"
#: Kept for callers that name the current format.
FORMAT_V2 = FORMAT

_VERSION_RE = re.compile(r"^(\d{20})\.json$")
# A plain file name: no separators, no control characters, no scheme colon.
_PLAIN_NAME_RE = re.compile(r"^[^/\\:\x00-\x1f\x7f]{1,255}$")
_WRITER_RE = re.compile(r"^[A-Za-z0-9]{1,64}$")
# A sidecar inside the prefix: "_reports/<name>" or "_quarantine/<name>".
_SIDECAR_RE = re.compile(r"^_(reports|quarantine)/[A-Za-z0-9._-]{1,200}$")

_COUNT = {"type": "integer", "minimum": 0}
_FILE_SCHEMA_V1 = {
    "type": "object",
    "required": ["path", "num_rows", "num_bytes", "sha256"],
    "properties": {
        "path": {"type": "string"},
        "num_rows": _COUNT,
        "num_bytes": _COUNT,
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
}
_FILE_SCHEMA_V2 = {
    **_FILE_SCHEMA_V1,
    "required": [*_FILE_SCHEMA_V1["required"], "row_groups", "writer"],
    "properties": {
        **_FILE_SCHEMA_V1["properties"],
        "row_groups": {"type": "array", "items": _COUNT},
        "writer": {"type": "string", "pattern": _WRITER_RE.pattern},
    },
    "additionalProperties": False,
}
_INPUT_SCHEMA = {
    "type": "object",
    "required": ["uri", "size"],
    "properties": {
        "uri": {"type": "string"},
        "size": {"anyOf": [_COUNT, {"type": "null"}]},
        "generation": {"type": ["string", "null"]},
    },
}
#: JSON Schema of a manifest document (both formats).
JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "schema", "files"],
    "properties": {
        "format": {"enum": [FORMAT_V1, FORMAT]},
        "schema": {"type": "string"},
        "created_at": {"type": "string"},
        "fingerprint": {"type": ["string", "null"]},
        "num_rows": _COUNT,
        "num_bytes": _COUNT,
        "columns": {"type": "object"},
        "metadata": {"type": ["object", "null"]},
    },
    "allOf": [
        {
            "if": {"properties": {"format": {"const": FORMAT}}},
            "then": {
                "required": ["version", "writer", "files", "inputs", "report", "quarantine"],
                "properties": {
                    "version": {"type": "integer", "minimum": 1},
                    "parent": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                    "writer": {"type": "string", "pattern": _WRITER_RE.pattern},
                    "files": {"type": "array", "items": _FILE_SCHEMA_V2},
                    "inputs": {"anyOf": [{"type": "array", "items": _INPUT_SCHEMA},
                                         {"type": "null"}]},
                    "report": {"type": ["string", "null"]},
                    "quarantine": {"type": ["string", "null"]},
                },
            },
            "else": {"properties": {"files": {"type": "array", "items": _FILE_SCHEMA_V1}}},
        }
    ],
}


@dataclasses.dataclass(frozen=True)
class ManifestFile:
    """One Parquet shard of a committed dataset.

    ``row_groups`` (rows per Parquet row group) and ``writer`` are empty for
    version-1 manifests.
    """

    path: str
    num_rows: int
    num_bytes: int
    sha256: str
    row_groups: tuple[int, ...] = ()
    writer: str = ""


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file a pipeline read, as listed when its fingerprint was computed.

    ``generation`` is the GCS object generation, or the local modification
    time in nanoseconds, as a string; None when the storage has neither.
    """

    uri: str
    size: int | None
    generation: str | None = None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """One immutable version of a committed dataset.

    Attributes:
        files: Shards in dataset order.
        schema: The Arrow schema every shard has.
        fingerprint: Fingerprint of the pipeline that produced it, if any.
        created_at: ISO-8601 UTC commit time.
        metadata: Free-form JSON-serialisable metadata (fit statistics, run id).
        version: The version number (1 for a version-1 ``_manifest.json``; 0
            for a manifest not committed yet).
        parent: The version that was current when its writer started (None for the first).
        writer: Id of the writer that committed it ("" for version-1 manifests).
        inputs: The input listing the fingerprint was computed from, if the
            writer recorded one.
        report: Path of the run report, relative to the prefix, if any.
        quarantine: Folder of the run's quarantined records, relative to the prefix, if any.
        format: ``slicefeed.dataset/v2`` or ``slicefeed.dataset/v1``.
    """

    files: tuple[ManifestFile, ...]
    schema: pa.Schema
    fingerprint: str | None = None
    created_at: str = ""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = 0
    parent: int | None = None
    writer: str = ""
    inputs: tuple[InputFile, ...] | None = None
    report: str | None = None
    quarantine: str | None = None
    format: str = FORMAT

    @property
    def num_rows(self) -> int:
        return sum(f.num_rows for f in self.files)

    @property
    def num_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)

    def to_json(self) -> str:
        """The ``slicefeed.dataset/v2`` document of this manifest."""
        schema_b64 = base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii")
        doc = {
            "format": FORMAT,
            "version": self.version,
            "parent": self.parent,
            "writer": self.writer,
            "created_at": self.created_at or now_iso(),
            "fingerprint": self.fingerprint,
            "inputs": None if self.inputs is None else [dataclasses.asdict(i) for i in self.inputs],
            "num_rows": self.num_rows,
            "num_bytes": self.num_bytes,
            "schema": schema_b64,
            "columns": {f.name: str(f.type) for f in self.schema},
            "files": [
                {**dataclasses.asdict(f), "row_groups": list(f.row_groups),
                 "writer": f.writer or self.writer}
                for f in self.files
            ],
            "report": self.report,
            "quarantine": self.quarantine,
            "metadata": self.metadata,
        }
        return json.dumps(doc, indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "<manifest>") -> Manifest:
        """Parses and validates a manifest document (either format).

        Raises:
            CorruptManifestError: naming ``source`` and what is wrong: not JSON,
                not matching the manifest JSON schema (a count that is not a
                non-negative integer, ...), a file path that is not a plain file
                name inside the prefix, a sidecar path outside it, or a schema
                that does not parse.
        """
        import jsonschema

        def bad(what: str) -> CorruptManifestError:
            return CorruptManifestError(
                f"{source} is not a valid slicefeed manifest: {what}. Do not read this "
                "dataset; re-run the job that wrote it with --overwrite (the bad file is "
                f"kept aside under {CORRUPT_DIR}/)."
            )

        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"not JSON ({_short(e)})") from None
        try:
            jsonschema.validate(doc, JSON_SCHEMA)
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "the document"
            raise bad(f"at {_short(where)}: {_short(e.message)}") from None
        for i, f in enumerate(doc["files"]):
            p = f["path"]
            if not _PLAIN_NAME_RE.match(p) or p in (".", ".."):
                raise bad(
                    f"files[{i}].path {_short(repr(p))} is not a plain file name inside the "
                    "dataset prefix (no '/', '..', absolute path or scheme)"
                )
        for key in ("report", "quarantine"):
            v = doc.get(key)
            if v is not None and (not _SIDECAR_RE.match(v) or ".." in v.split("/")):
                raise bad(f"{key} {_short(repr(v))} is not a path inside the dataset prefix")
        if len({f["path"] for f in doc["files"]}) != len(doc["files"]):
            raise bad("a file is listed twice")
        try:
            raw = pa.py_buffer(base64.b64decode(doc["schema"], validate=True))
            schema = pa.ipc.read_schema(raw)
            # A dataset Ray Data wrote holds its tensor extension types, which
            # read as their storage (shapes lost) until ray.data registers them.
            if _compat.register_ray_extension_types(schema):
                schema = pa.ipc.read_schema(raw)
        except (ValueError, TypeError, pa.ArrowException) as e:
            raise bad(f"its schema does not parse ({_short(e)})") from None
        for key in ("num_rows", "num_bytes"):
            if key in doc and doc[key] != sum(f[key] for f in doc["files"]):
                raise bad(f"{key} is {doc[key]}, but its files add up to "
                          f"{sum(f[key] for f in doc['files'])}")
        v2 = doc["format"] == FORMAT
        files = tuple(
            ManifestFile(
                path=f["path"], num_rows=f["num_rows"], num_bytes=f["num_bytes"],
                sha256=f["sha256"], row_groups=tuple(f.get("row_groups") or ()),
                writer=f.get("writer", ""),
            )
            for f in doc["files"]
        )
        for f in files:
            if f.row_groups and sum(f.row_groups) != f.num_rows:
                raise bad(f"{f.path}: its row groups add up to {sum(f.row_groups)} rows, "
                          f"not num_rows {f.num_rows}")
        inputs = doc.get("inputs") if v2 else None
        return cls(
            files=files,
            schema=schema,
            fingerprint=doc.get("fingerprint"),
            created_at=doc.get("created_at", ""),
            metadata=doc.get("metadata") or {},
            version=doc["version"] if v2 else 1,
            parent=doc.get("parent") if v2 else None,
            writer=doc.get("writer", "") if v2 else "",
            inputs=None if inputs is None else tuple(
                InputFile(i["uri"], i["size"], i.get("generation")) for i in inputs),
            report=doc.get("report") if v2 else None,
            quarantine=doc.get("quarantine") if v2 else None,
            format=doc["format"],
        )


def _short(x: Any, limit: int = 200) -> str:
    """``x`` as text, control characters escaped, at most ``limit`` characters."""
    s = str(x).encode("unicode_escape").decode("ascii")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def version_name(version: int) -> str:
    """``_versions/<20-digit version>.json``: sorts by name in version order."""
    return f"{VERSIONS_DIR}/{version:020d}.json"


def _resolve(uri: str | ResolvedPath, fs_kwargs: dict[str, Any]) -> ResolvedPath:
    return uri if isinstance(uri, ResolvedPath) else resolve_filesystem(uri, **fs_kwargs)


def manifest_location(uri: str | ResolvedPath, **fs_kwargs: Any) -> ResolvedPath:
    """The resolved path of ``<uri>/_manifest.json`` (a version-1 manifest)."""
    return _resolve(uri, fs_kwargs).join(MANIFEST_NAME)


def list_names(d: ResolvedPath) -> list[str]:
    """Names directly inside folder ``d``, fresh from storage (no listing cache); [] if none."""
    try:
        if d.protocol == "gs":
            paths = d.fs.ls(d.path, detail=False, refresh=True)
        else:
            paths = d.fs.ls(d.path, detail=False)
    except (FileNotFoundError, NotADirectoryError):  # nothing there, or a file
        return []
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in paths]


def list_versions(uri: str | ResolvedPath, **fs_kwargs: Any) -> dict[int, ResolvedPath]:
    """Every committed version of ``uri`` still stored: number -> manifest location.

    A version-1 ``_manifest.json`` counts as version 1 unless a
    ``_versions/`` file claims that number. Reads listings only.
    """
    target = _resolve(uri, fs_kwargs)
    out: dict[int, ResolvedPath] = {}
    vdir = target.join(VERSIONS_DIR)
    for name in list_names(vdir):
        m = _VERSION_RE.match(name)
        if m:
            out[int(m.group(1))] = vdir.join(name)
    legacy = target.join(MANIFEST_NAME)
    if target.protocol == "gs":
        target.fs.invalidate_cache(target.path)
    if 1 not in out and target.fs.exists(legacy.path):
        out[1] = legacy
    return dict(sorted(out.items()))


def current_version(uri: str | ResolvedPath, **fs_kwargs: Any) -> int | None:
    """The current (highest committed) version of ``uri``, or None when there is none."""
    versions = list_versions(uri, **fs_kwargs)
    return max(versions) if versions else None


def is_committed(uri: str | ResolvedPath, **fs_kwargs: Any) -> bool:
    """Whether ``uri`` holds a committed dataset (some manifest version exists)."""
    return bool(list_versions(uri, **fs_kwargs))


def read_manifest(
    uri: str | ResolvedPath, *, version: int | None = None, **fs_kwargs: Any
) -> Manifest:
    """Reads one version of the manifest of the committed dataset at ``uri``.

    Args:
        uri: The dataset prefix (not a manifest file).
        version: The version to read; default the current (highest) one.
        **fs_kwargs: Passed to :func:`resolve_filesystem` (credentials, anonymous, ...).

    Raises:
        NotCommittedError: ``uri`` has no committed version, or not ``version``
            (vacuumed or never committed; the message lists the retained ones).
        CorruptManifestError: the manifest does not validate.
    """
    target = _resolve(uri, fs_kwargs)
    versions = list_versions(target)
    if not versions:
        raise NotCommittedError(
            f"{target.uri} is not a committed slicefeed dataset: it has no manifest "
            f"({VERSIONS_DIR}/ or {MANIFEST_NAME}). Either the job that writes it has not "
            "finished (or crashed; run it again to commit), or this is a folder of raw files: "
            "read those with read_parquet/read_jsonl/read_csv instead of read_dataset."
        )
    if version is None:
        version = max(versions)
    elif isinstance(version, bool) or not isinstance(version, int) or version not in versions:
        raise NotCommittedError(
            f"{target.uri}: version {_short(repr(version), 40)} is not retained; retained "
            f"versions: {', '.join(map(str, versions))} (current {max(versions)}). Older "
            "versions are removed by `slicefeed vacuum` after their retention."
        )
    loc = versions[version]
    try:
        with loc.fs.open(loc.path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise NotCommittedError(
            f"{target.uri}: version {version} was removed while being opened (vacuum); "
            "open the dataset again."
        ) from None
    m = Manifest.from_json(data, source=loc.uri)
    if m.format == FORMAT and m.version != version:
        raise CorruptManifestError(
            f"{loc.uri} is not a valid slicefeed manifest: it says version {m.version} but is "
            f"stored as version {version}."
        )
    return m
