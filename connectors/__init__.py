"""Storage for slicefeed: filesystems, readers, writers, committed datasets.

Public API::

    from slicefeed.connectors import (
        resolve_filesystem, expand_paths,
        read_parquet, read_jsonl, read_csv, read_text,
        write_parquet, read_dataset, read_manifest, vacuum,
        SpecError, MissingColumnError, ...         # errors (one module, picklable)
        PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN, ON_ERROR_POLICIES, ...
    )

Importing this package imports neither Ray nor jax; the readers and writers
import Ray when first used.
"""

from typing import TYPE_CHECKING, Any

from slicefeed.connectors._errors import (
    AlreadyCommittedError,
    BadRecordError,
    CommitConflictError,
    CorruptFileError,
    CorruptManifestError,
    MissingColumnError,
    NotCommittedError,
    ShardMismatchError,
    SlicefeedError,
    SpecError,
    WorkerCrashError,
    printable,
    short_repr,
    type_name,
    typed_columns,
)
from slicefeed.connectors._names import (
    ERROR_COLUMN,
    ON_ERROR_POLICIES,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    RAW_COLUMN,
    RESERVED_COLUMNS,
)

# Everything else is imported on first use, so that importing the package
# (for an error type or a column name) does not import Ray.
_LAZY = {
    "ResolvedPath": "_fs",
    "expand_paths": "_fs",
    "resolve_filesystem": "_fs",
    "peek_schema": "_readers",
    "read_csv": "_readers",
    "read_jsonl": "_readers",
    "read_parquet": "_readers",
    "read_text": "_readers",
    "read_dataset": "_writers",
    "write_parquet": "_writers",
    "MANIFEST_NAME": "_manifest",
    "QUARANTINE_DIR": "_manifest",
    "REPORT_NAME": "_manifest",
    "REPORTS_DIR": "_manifest",
    "InputFile": "_manifest",
    "Manifest": "_manifest",
    "ManifestFile": "_manifest",
    "current_version": "_manifest",
    "is_committed": "_manifest",
    "list_versions": "_manifest",
    "read_manifest": "_manifest",
    "DEFAULT_RETAIN_HOURS": "_commit",
    "Lease": "_commit",
    "VacuumResult": "_commit",
    "check_sink_outside_sources": "_commit",
    "list_inputs": "_commit",
    "new_writer_id": "_commit",
    "vacuum": "_commit",
    "write_atomic": "_commit",
    "verify_shards": "_verify",
}

if TYPE_CHECKING:  # pragma: no cover
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
        peek_schema,
        read_csv,
        read_jsonl,
        read_parquet,
        read_text,
    )
    from slicefeed.connectors._verify import verify_shards
    from slicefeed.connectors._writers import read_dataset, write_parquet


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_RETAIN_HOURS",
    "ERROR_COLUMN",
    "MANIFEST_NAME",
    "ON_ERROR_POLICIES",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "QUARANTINE_DIR",
    "RAW_COLUMN",
    "REPORTS_DIR",
    "REPORT_NAME",
    "RESERVED_COLUMNS",
    "AlreadyCommittedError",
    "BadRecordError",
    "CommitConflictError",
    "CorruptFileError",
    "CorruptManifestError",
    "InputFile",
    "Lease",
    "Manifest",
    "ManifestFile",
    "MissingColumnError",
    "NotCommittedError",
    "ResolvedPath",
    "ShardMismatchError",
    "SlicefeedError",
    "SpecError",
    "VacuumResult",
    "WorkerCrashError",
    "check_sink_outside_sources",
    "current_version",
    "expand_paths",
    "is_committed",
    "list_inputs",
    "list_versions",
    "new_writer_id",
    "peek_schema",
    "printable",
    "read_csv",
    "read_dataset",
    "read_jsonl",
    "read_manifest",
    "read_parquet",
    "read_text",
    "resolve_filesystem",
    "short_repr",
    "type_name",
    "typed_columns",
    "vacuum",
    "verify_shards",
    "write_atomic",
    "write_parquet",
]
