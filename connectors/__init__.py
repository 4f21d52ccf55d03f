"""Storage for slicefeed: filesystems, readers, writers, committed datasets.

Public API::

    from slicefeed.connectors import (
        resolve_filesystem, expand_paths,
        read_parquet, read_jsonl, read_csv, read_text,
        write_parquet, read_dataset, read_manifest, vacuum,
    )

This package never imports jax.
"""

from slicefeed.connectors._commit import (
    DEFAULT_RETAIN_HOURS,
    Lease,
    VacuumResult,
    check_sink_outside_sources,
    list_inputs,
    new_writer_id,
    vacuum,
    write_atomic,
)
from slicefeed.connectors._errors import (
    AlreadyCommittedError,
    BadRecordError,
    CommitConflictError,
    CorruptFileError,
    CorruptManifestError,
    NotCommittedError,
    ShardMismatchError,
    SlicefeedError,
    SpecError,
)
from slicefeed.connectors._fs import ResolvedPath, expand_paths, resolve_filesystem
from slicefeed.connectors._manifest import (
    MANIFEST_NAME,
    QUARANTINE_DIR,
    REPORT_NAME,
    REPORTS_DIR,
    InputFile,
    Manifest,
    ManifestFile,
    current_version,
    is_committed,
    list_versions,
    read_manifest,
)
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

__all__ = [
    "DEFAULT_RETAIN_HOURS",
    "MANIFEST_NAME",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "QUARANTINE_DIR",
    "REPORTS_DIR",
    "REPORT_NAME",
    "AlreadyCommittedError",
    "BadRecordError",
    "CommitConflictError",
    "CorruptFileError",
    "CorruptManifestError",
    "InputFile",
    "Lease",
    "Manifest",
    "ManifestFile",
    "NotCommittedError",
    "ResolvedPath",
    "ShardMismatchError",
    "SlicefeedError",
    "SpecError",
    "VacuumResult",
    "check_sink_outside_sources",
    "current_version",
    "expand_paths",
    "is_committed",
    "list_inputs",
    "list_versions",
    "new_writer_id",
    "peek_schema",
    "read_csv",
    "read_dataset",
    "read_jsonl",
    "read_manifest",
    "read_parquet",
    "read_text",
    "resolve_filesystem",
    "vacuum",
    "write_atomic",
    "write_parquet",
]
