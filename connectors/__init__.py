"""Storage for slicefeed: filesystems, readers, writers, committed datasets.

Public API::

    from slicefeed.connectors import (
        resolve_filesystem, expand_paths,
        read_parquet, read_jsonl, read_csv, read_text,
        write_parquet, read_dataset, read_manifest,
    )

This package never imports jax.
"""

from slicefeed.connectors._errors import (
    AlreadyCommittedError,
    BadRecordError,
    CorruptFileError,
    NotCommittedError,
    SlicefeedError,
    SpecError,
    WorkerCrashError,
    short_repr,
)
from slicefeed.connectors._fs import ResolvedPath, expand_paths, resolve_filesystem
from slicefeed.connectors._readers import (
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    peek_schema,
    read_csv,
    read_jsonl,
    read_parquet,
    read_text,
)
from slicefeed.connectors._writers import read_dataset, write_parquet
from slicefeed.connectors._manifest import (
    MANIFEST_NAME,
    REPORT_NAME,
    Manifest,
    ManifestFile,
    is_committed,
    read_manifest,
)

__all__ = [
    "AlreadyCommittedError",
    "BadRecordError",
    "CorruptFileError",
    "MANIFEST_NAME",
    "Manifest",
    "ManifestFile",
    "NotCommittedError",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "REPORT_NAME",
    "ResolvedPath",
    "SlicefeedError",
    "SpecError",
    "WorkerCrashError",
    "expand_paths",
    "is_committed",
    "peek_schema",
    "read_csv",
    "read_dataset",
    "read_jsonl",
    "read_parquet",
    "read_text",
    "write_parquet",
    "read_manifest",
    "resolve_filesystem",
    "short_repr",
]
