"""``slicefeed inspect``: what is at a URI, from metadata where possible."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from slicefeed.connectors import expand_paths, is_committed, read_manifest, resolve_filesystem
from slicefeed.connectors._formats import FORMATS, FileFormat, format_of_path, get_format
from slicefeed.transforms import type_label


def inspect_uri(uri: str, *, fmt: str = "auto", options: dict[str, Any] | None = None,
                verify: bool = False) -> dict[str, Any]:
    """Describes a committed dataset (from its manifest) or raw files.

    For a committed dataset, shard sizes and row counts are checked against
    the manifest; ``verify`` also checks every shard's SHA-256 (and refuses
    raw files, which have no manifest to check against).

    Parquet row counts come from footers; JSONL, CSV and text files are
    parsed whole, as their reader parses them (``options``; ``.tsv`` files are
    tab-separated), to count rows (use on samples, not terabytes).

    Raises:
        FileNotFoundError: nothing at ``uri``.
        SpecError: the format cannot be inferred from file names and ``fmt`` is
            auto, or ``verify`` on raw files.
        ShardMismatchError / CorruptFileError: a shard differs from the manifest
            (the first one is named).
    """
    from slicefeed.connectors import SpecError

    resolved = resolve_filesystem(uri)
    if is_committed(resolved):
        from slicefeed.connectors import list_versions, verify_shards

        m = read_manifest(resolved)
        verify_shards(resolved, m, checksums=verify)
        return {
            "uri": resolved.uri, "kind": "committed slicefeed dataset",
            "version": m.version, "versions": list(list_versions(resolved)),
            "verified": "sha256" if verify else "sizes and row counts",
            "num_rows": m.num_rows,
            "num_bytes": m.num_bytes, "fingerprint": m.fingerprint, "created_at": m.created_at,
            "schema": {f.name: type_label(f) for f in m.schema},
            "files": [{"path": f.path, "num_rows": f.num_rows, "num_bytes": f.num_bytes,
                       "sha256": f.sha256} for f in m.files],
            "metadata": m.metadata,
        }
    if verify:
        raise SpecError(f"{resolved.uri}: --verify needs a committed dataset (its manifest "
                        "records the checksums); this is not one.")
    if fmt != "auto":
        get_format(fmt)
        paths = expand_paths(resolved, suffixes=FORMATS[fmt].listing_suffixes)
        fmts = {fmt}
    else:
        paths = expand_paths(resolved)
        fmts = {format_of_path(p) for p in paths}
    if None in fmts or len(fmts) != 1:
        raise SpecError(
            f"{resolved.uri}: cannot tell the format from the file names "
            f"({', '.join(sorted(str(f) for f in fmts))}); pass --format {'|'.join(FORMATS)}."
        )
    (kind,) = fmts
    file_format = FORMATS[kind]
    files, schema, total = [], None, 0
    for p in paths:
        size = resolved.fs.size(p)
        t_schema, rows = _describe(file_format, resolved, p, options)
        schema = schema or t_schema
        total += rows
        files.append({"path": resolved.to_uri(p), "num_bytes": size, "num_rows": rows})
    return {
        "uri": resolved.uri, "kind": f"raw {kind} files (not a committed dataset)",
        "num_rows": total, "num_bytes": sum(f["num_bytes"] for f in files),
        "schema": {f.name: type_label(f) for f in schema}, "files": files,
    }


def _describe(fmt: FileFormat, resolved: Any, path: str, options: dict[str, Any] | None) -> tuple[pa.Schema, int]:
    if fmt.parse is None:  # Parquet: schema and rows from the footer
        from slicefeed.connectors._parquet import open_parquet

        with resolved.fs.open(path, "rb") as f:
            pf = open_parquet(f)
            return pf.schema_arrow, pf.metadata.num_rows
    with resolved.fs.open(path, "rb", compression="infer") as f:
        data = f.read()
    t = fmt.parse(data, fmt.options_for(path, options))
    return t.schema, t.num_rows
