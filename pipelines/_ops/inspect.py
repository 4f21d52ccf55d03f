"""``slicefeed inspect``: what is at a URI, from metadata where possible."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from slicefeed.connectors import expand_paths, is_committed, read_manifest, resolve_filesystem

_BY_SUFFIX = {
    ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".json": "jsonl",
    ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv", ".txt": "text",
}


def _format_of(path: str) -> str | None:
    for suffix, fmt in _BY_SUFFIX.items():
        if path.endswith(suffix) or path.endswith(suffix + ".gz"):
            return fmt
    return None


def inspect_uri(uri: str, *, fmt: str = "auto") -> dict[str, Any]:
    """Describes a committed dataset (from its manifest) or raw files.

    Parquet row counts come from footers; JSONL, CSV and text files are
    parsed whole to count rows (use on samples, not terabytes).

    Raises:
        FileNotFoundError: nothing at ``uri``.
        SpecError: the format cannot be inferred from file names and ``fmt`` is auto.
    """
    from slicefeed.connectors import SpecError

    resolved = resolve_filesystem(uri)
    if is_committed(resolved):
        m = read_manifest(resolved)
        return {
            "uri": resolved.uri, "kind": "committed slicefeed dataset", "num_rows": m.num_rows,
            "num_bytes": m.num_bytes, "fingerprint": m.fingerprint, "created_at": m.created_at,
            "schema": {f.name: str(f.type) for f in m.schema},
            "files": [{"path": f.path, "num_rows": f.num_rows, "num_bytes": f.num_bytes,
                       "sha256": f.sha256} for f in m.files],
            "metadata": m.metadata,
        }
    paths = expand_paths(resolved)
    fmts = {fmt} if fmt != "auto" else {_format_of(p) for p in paths}
    if None in fmts or len(fmts) != 1:
        raise SpecError(
            f"{resolved.uri}: cannot tell the format from the file names "
            f"({', '.join(sorted(str(f) for f in fmts))}); pass --format parquet|jsonl|csv|text."
        )
    (kind,) = fmts
    files, schema, total = [], None, 0
    for p in paths:
        size = resolved.fs.size(p)
        with resolved.fs.open(p, "rb") as f:
            t_schema, rows = _describe(kind, f)
        schema = schema or t_schema
        total += rows
        files.append({"path": resolved.to_uri(p), "num_bytes": size, "num_rows": rows})
    return {
        "uri": resolved.uri, "kind": f"raw {kind} files (not a committed dataset)",
        "num_rows": total, "num_bytes": sum(f["num_bytes"] for f in files),
        "schema": {f.name: str(f.type) for f in schema}, "files": files,
    }


def _describe(kind: str, f: Any) -> tuple[pa.Schema, int]:
    import io

    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        return pf.schema_arrow, pf.metadata.num_rows
    data = f.read()
    if kind == "text":
        n = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
        return pa.schema([("text", pa.string())]), n
    if kind == "jsonl":
        import pyarrow.json as pajson

        t = pajson.read_json(io.BytesIO(data))
    else:
        import pyarrow.csv as pacsv

        t = pacsv.read_csv(io.BytesIO(data))
    return t.schema, t.num_rows
