"""Tiny datasets for the loader tests, written by pyarrow (not Ray).

Importable from the test modules and from the subprocess workers.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_table(start: int, n: int, width: int = 4) -> pa.Table:
    """Rows ``start .. start+n-1``: ``id`` int32 (JAX without x64 refuses int64
    columns unless ``dtypes`` casts them), ``x`` fixed_size_list<float32>[width]
    (x[i] = id * 10 + j), ``y`` fixed_size_list<fixed_size_list<int32>[2]>[3]."""
    ids = np.arange(start, start + n, dtype=np.int32)
    x = (ids[:, None] * 10 + np.arange(width)[None, :]).astype(np.float32)
    y = (ids[:, None] + np.arange(6)[None, :]).astype(np.int32)
    return pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width),
            "y": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(y.ravel()), 2), 3
            ),
        }
    )


def write_committed(
    uri: str, sizes: list[int], *, row_group_size: int = 7, width: int = 4
) -> int:
    """Writes ``part-*.parquet`` files of ``sizes`` rows and manifest version 1
    under ``uri`` (local path or gs://). Returns the total row count; ids are
    0..N-1 across files."""
    import io

    from slicefeed.connectors import Manifest, ManifestFile, resolve_filesystem
    from slicefeed.connectors._manifest import version_name

    root = resolve_filesystem(uri)
    root.fs.makedirs(root.path, exist_ok=True)
    files = []
    start = 0
    schema = None
    for i, n in enumerate(sizes):
        t = make_table(start, n, width)
        schema = t.schema
        name = f"part-{i:05d}.parquet"
        sink = io.BytesIO()
        pq.write_table(t, sink, row_group_size=row_group_size)
        data = sink.getvalue()
        with root.fs.open(root.join(name).path, "wb") as f:
            f.write(data)
        groups = pq.read_metadata(io.BytesIO(data))
        files.append(ManifestFile(
            name, n, len(data), hashlib.sha256(data).hexdigest(),
            tuple(groups.row_group(k).num_rows for k in range(groups.num_row_groups)), "testdata"))
        start += n
    m = Manifest(files=tuple(files), schema=schema, version=1, writer="testdata")
    root.fs.makedirs(root.join("_versions").path, exist_ok=True)
    with root.fs.open(root.join(version_name(1)).path, "wb") as f:
        f.write(m.to_json().encode())
    return start


def commit_manifest(uri: str, manifest) -> None:
    """Commits ``manifest`` (files already written) as version 1 of the dataset at ``uri``."""
    import dataclasses

    from slicefeed.connectors import resolve_filesystem
    from slicefeed.connectors._manifest import version_name

    root = resolve_filesystem(uri)
    m = dataclasses.replace(manifest, version=1, writer="testdata")
    root.fs.makedirs(root.join("_versions").path, exist_ok=True)
    with root.fs.open(root.join(version_name(1)).path, "wb") as f:
        f.write(m.to_json().encode())
