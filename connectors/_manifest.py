"""Committed datasets: the ``_manifest.json`` format.

A committed dataset is a prefix holding Parquet shards and, written last, a
``_manifest.json`` listing every shard. Readers go through the manifest only,
so files left by a crashed run are never read, and a prefix without a
manifest is not a dataset.

Format (``format: "slicefeed.dataset/v1"``)::

    {
      "format": "slicefeed.dataset/v1",
      "created_at": "2026-11-29T14:00:00+00:00",
      "fingerprint": "<sha256 of the producing pipeline, or null>",
      "num_rows": 1000, "num_bytes": 123456,
      "schema": "<base64 Arrow IPC schema>",
      "columns": {"tokens": "fixed_size_list<item: int32>[2048]", ...},
      "files": [{"path": "part-00000-<run>.parquet", "num_rows": 500,
                 "num_bytes": 61728, "sha256": "..."}, ...],
      "metadata": {...}            # free-form: fit statistics, run id, versions
    }

``path`` is relative to the dataset prefix.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
from typing import Any

import pyarrow as pa

from slicefeed.connectors._errors import NotCommittedError
from slicefeed.connectors._fs import ResolvedPath, resolve_filesystem

MANIFEST_NAME = "_manifest.json"
REPORT_NAME = "_report.json"
FORMAT = "slicefeed.dataset/v1"


@dataclasses.dataclass(frozen=True)
class ManifestFile:
    """One Parquet shard of a committed dataset."""

    path: str
    num_rows: int
    num_bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The manifest of a committed dataset.

    Attributes:
        files: Shards in dataset order.
        schema: The Arrow schema every shard has.
        fingerprint: Fingerprint of the pipeline that produced it, if any.
        metadata: Free-form JSON-serialisable metadata (fit statistics, run id).
    """

    files: tuple[ManifestFile, ...]
    schema: pa.Schema
    fingerprint: str | None = None
    created_at: str = ""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return sum(f.num_rows for f in self.files)

    @property
    def num_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)

    def to_json(self) -> str:
        schema_b64 = base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii")
        doc = {
            "format": FORMAT,
            "created_at": self.created_at
            or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "fingerprint": self.fingerprint,
            "num_rows": self.num_rows,
            "num_bytes": self.num_bytes,
            "schema": schema_b64,
            "columns": {f.name: str(f.type) for f in self.schema},
            "files": [dataclasses.asdict(f) for f in self.files],
            "metadata": self.metadata,
        }
        return json.dumps(doc, indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str, *, source: str = "<manifest>") -> "Manifest":
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
            files = tuple(ManifestFile(**f) for f in doc["files"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{source} is not a valid slicefeed manifest ({e}). Re-run the job that "
                "wrote this dataset with overwrite to rewrite it."
            ) from e
        return cls(
            files=files,
            schema=schema,
            fingerprint=doc.get("fingerprint"),
            created_at=doc.get("created_at", ""),
            metadata=doc.get("metadata") or {},
        )


def manifest_location(uri: str | ResolvedPath, **fs_kwargs: Any) -> ResolvedPath:
    """The resolved path of ``<uri>/_manifest.json``."""
    resolved = uri if isinstance(uri, ResolvedPath) else resolve_filesystem(uri, **fs_kwargs)
    return resolved.join(MANIFEST_NAME)


def is_committed(uri: str | ResolvedPath, **fs_kwargs: Any) -> bool:
    """Whether ``uri`` holds a committed dataset (its manifest exists)."""
    loc = manifest_location(uri, **fs_kwargs)
    return loc.fs.exists(loc.path)


def read_manifest(uri: str | ResolvedPath, **fs_kwargs: Any) -> Manifest:
    """Reads the manifest of the committed dataset at ``uri``.

    Args:
        uri: The dataset prefix (not the manifest file itself).
        **fs_kwargs: Passed to :func:`resolve_filesystem` (credentials, anonymous, ...).

    Raises:
        NotCommittedError: If ``uri`` has no ``_manifest.json``.
    """
    loc = manifest_location(uri, **fs_kwargs)
    try:
        with loc.fs.open(loc.path, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        base = loc.uri[: -len(MANIFEST_NAME) - 1]
        raise NotCommittedError(
            f"{base} is not a committed slicefeed dataset: it has no {MANIFEST_NAME}. "
            "Either the job that writes it has not finished (or crashed; run it again "
            "to commit), or this is a folder of raw files: read those with "
            "read_parquet/read_jsonl/read_csv instead of read_dataset."
        ) from None
    return Manifest.from_json(text, source=loc.uri)
