"""Encoding one committed shard: Parquet bytes with row groups bounded by decoded size.

A reader decodes whole row groups (or streams one in pieces), so a row group's
decoded size is the unit of read memory and of wasted decoding; bounding it by
bytes, not rows, keeps wide rows (long token sequences, images) from making
gigabyte row groups and narrow rows from making tiny ones.
"""

from __future__ import annotations

import pyarrow as pa

#: Default bound on a row group's decoded (Arrow, uncompressed) size.
ROW_GROUP_BYTES = 64 << 20
#: pyarrow's own cap on rows per row group.
MAX_ROW_GROUP_ROWS = 1 << 20


def encode_shard(
    table: pa.Table,
    *,
    compression: str = "snappy",
    row_group_size: int | None = None,
    row_group_bytes: int | None = None,
) -> tuple[bytes, list[int]]:
    """Parquet bytes of ``table`` and its row groups' row counts.

    Each row group holds at most ``row_group_size`` rows and at most
    ``row_group_bytes`` (default :data:`ROW_GROUP_BYTES`) of decoded Arrow data,
    measured on the rows themselves (so uneven rows are bounded too); a single
    row larger than the bound is a row group of its own. The rows are sized to
    7/8 of the bound: a reader allocates validity bitmaps the writer's arrays
    may not have (at most one bit per value of a byte-or-wider column).
    """
    import pyarrow.parquet as pq

    limit = int(row_group_bytes or ROW_GROUP_BYTES) * 7 // 8
    cap = min(int(row_group_size or MAX_ROW_GROUP_ROWS), MAX_ROW_GROUP_ROWS)
    n = table.num_rows
    sink = pa.BufferOutputStream()
    groups: list[int] = []
    with pq.ParquetWriter(sink, table.schema, compression=compression) as writer:
        i = 0
        per_row = table.nbytes / max(n, 1)
        while i < n:
            k = min(cap, n - i, max(1, int(limit // max(per_row, 1e-9))))
            part = table.slice(i, k)
            while k > 1 and part.nbytes > limit:
                # Rows here are larger than the average: shrink in proportion.
                k = max(1, min(k - 1, int(k * limit / part.nbytes)))
                part = table.slice(i, k)
            writer.write_table(part, row_group_size=k)
            groups.append(k)
            i += k
    buf = sink.getvalue()
    return buf.to_pybytes(), groups
