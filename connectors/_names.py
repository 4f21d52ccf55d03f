"""Names slicefeed reserves in every table it reads, transforms and writes.

One home for the column names and bad-record policies that readers,
transforms and pipelines all use; each of them imports these constants
rather than spelling the strings again.
"""

from __future__ import annotations

#: Row identity: the file a row came from (path relative to the source URI).
PROVENANCE_FILE = "_sf_file"
#: Row identity: the row's index within its file.
PROVENANCE_ROW = "_sf_row"
#: Reason a row is bad (null for good rows); present only when a row is bad.
#: Readers set it for undecodable records (``mark_errors=True``), transforms
#: for rows they cannot process.
ERROR_COLUMN = "_sf_error"
#: Raw bytes of a record a reader could not decode (JSONL line, text line).
RAW_COLUMN = "_sf_raw"
#: Columns owned by slicefeed itself; transforms carry them through.
RESERVED_COLUMNS = (PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN)

#: What a pipeline does with a bad record: raise, drop and count, or drop,
#: count and write it under ``<sink>/_quarantine/``.
ON_ERROR_POLICIES = ("fail", "skip", "quarantine")

__all__ = [
    "ERROR_COLUMN",
    "ON_ERROR_POLICIES",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "RAW_COLUMN",
    "RESERVED_COLUMNS",
]
