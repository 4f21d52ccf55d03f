"""Exact deduplication: Deduplicate (a dataset-level operation)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW, RESERVED_COLUMNS, short_repr
from slicefeed.transforms._categorical import is_hashable
from slicefeed.transforms._contract import DatasetTasks, Transform
from slicefeed.transforms._hashing import hash64, mix64

if TYPE_CHECKING:  # pragma: no cover
    import ray.data


#: The column :meth:`Deduplicate.dataset_op` groups by (a data column may not
#: have this name; key columns may have any other).
_HASH_COLUMN = "__sf_key"
#: Buckets :meth:`Deduplicate.dataset_op` groups rows into by their key hash:
#: each bucket is deduplicated by one call, so the Python calls per run are at
#: most this many, not one per distinct key (millions, in text deduplication).
#: Fixed, so a run's output order does not depend on the cluster.
DEDUP_BUCKETS = 256
#: Shuffle partitions (reduce tasks) :meth:`Deduplicate.dataset_op` spreads the
#: buckets over unless ``partitions`` says otherwise: Ray's own default for a
#: shuffle, written here so that a changed Ray context does not change it.
DEDUP_PARTITIONS = 200
#: Rows per block of :meth:`Deduplicate.dataset_op`'s output (the last block
#: holds the rest): fixed, so what each block holds, and so the shards and
#: what a batch transform after it sees together, is the same on every run.
DEDUP_BLOCK_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class Deduplicate(Transform):
    """Exact deduplication on ``columns`` (all data columns when omitted).

    A dataset-level operation (``is_dataset_op``): the pipeline calls
    ``ds = t.dataset_op(ds)``, which groups the whole dataset by the key
    columns (Ray ``groupby().map_groups()`` over :data:`DEDUP_BUCKETS` buckets
    of the key hash, a shuffle; each bucket deduplicated by one call) and keeps,
    per key, the row with the smallest (``_sf_file``, ``_sf_row``), so the
    survivor does not depend on scheduling. Rows come out by bucket, each
    bucket's in (``_sf_file``, ``_sf_row``) order, in blocks of
    :data:`DEDUP_BLOCK_ROWS` rows: the output, blocks included, is a function
    of the input rows alone, whatever order Ray's tasks finish in (the
    returned dataset keeps block order: ``preserve_order``). The shuffle is
    Ray's sort-based one, on a copy of the dataset's context. Called on a table
    (``t(table)``), it deduplicates within that table only. Nulls are equal to
    each other for this purpose, and so are 0.0 and -0.0; NaN keys are equal
    when their bits are (every NaN arithmetic produces is the same one).

    Args:
        columns: Key columns (strings, binary, numbers, booleans, dates).
        partitions: Shuffle partitions (reduce tasks) the buckets are spread
            over, 1 to :data:`DEDUP_BUCKETS`; default :data:`DEDUP_PARTITIONS`.
            Each holds about 1/``partitions`` of the data in one task, so keep
            the default for large data; a small input runs faster with a few
            (each partition costs a fixed scheduling overhead). The survivors,
            their order and their blocks are the same for any value; a value
            other than the default still changes the pipeline's fingerprint,
            as any argument does.
    """

    name: ClassVar[str] = "deduplicate"
    reads_only: ClassVar[bool] = True
    is_dataset_op: ClassVar[bool] = True
    columns: tuple[str, ...] | None = None
    partitions: int = DEDUP_PARTITIONS

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= DEDUP_BUCKETS:
            raise self._spec_error(
                f"partitions must be an integer in [1, {DEDUP_BUCKETS}] (there are {DEDUP_BUCKETS} "
                f"key-hash buckets to spread); got {short_repr(self.partitions)}"
            )
        if self.columns is not None:
            object.__setattr__(self, "columns", self._column_list(self.columns, "columns"))

    def _keys(self, names: Sequence[str]) -> list[str]:
        if self.columns is not None:
            return list(self.columns)
        return [n for n in names if n not in RESERVED_COLUMNS]

    def _refuse_hash_column(self, names: Sequence[str]) -> None:
        if _HASH_COLUMN in names:
            raise self._spec_error(
                f"the data has a column named {_HASH_COLUMN!r}, the name deduplicate gives its key "
                f"hash while it runs; rename that column first (a rename step)"
            )

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        self._refuse_hash_column(schema.names)
        for c in self._keys(schema.names):
            t = self._require(schema, c, arg="columns")
            if not is_hashable(t):
                raise self._spec_error(
                    f"column {short_repr(c)} has type {t}; deduplicate on scalar columns (strings, "
                    "binary, numbers, booleans, dates), e.g. columns: [text]"
                )
        return schema

    def _key_hash(self, table: pa.Table) -> pa.Array:
        h = np.zeros(table.num_rows, np.uint64)
        with np.errstate(over="ignore"):
            for c in self._keys(table.column_names):
                h = mix64(h ^ hash64(table.column(c), salt=c))
        return pa.array(h)

    def _order(self, table: pa.Table) -> list[tuple[str, str]]:
        return [(c, "ascending") for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c in table.column_names]

    def __call__(self, table: pa.Table) -> pa.Table:
        keys = self._keys(table.column_names)
        order = self._order(table)
        if order:
            table = table.sort_by(order)
        # Exact: group by the key columns themselves (positional names, so a
        # key may have any name); first row per key in order. Float keys
        # compare as numbers: -0.0 and 0.0 are one key, as in hash64 (the
        # survivor keeps its own value).
        cols = [pc.add(table.column(k), 0.0) if pa.types.is_floating(table.schema.field(k).type)
                else table.column(k) for k in keys]
        names = [f"k{i}" for i in range(len(keys))]
        tmp = pa.table([*cols, pa.array(np.arange(table.num_rows, dtype=np.int64))], names=[*names, "idx"])
        firsts = tmp.group_by(names, use_threads=False).aggregate([("idx", "min")])
        keep = np.sort(firsts.column("idx_min").to_numpy())
        return table.take(pa.array(keep))

    def dataset_op(self, ds: ray.data.Dataset, *, tasks: DatasetTasks | None = None
                   ) -> ray.data.Dataset:
        from slicefeed.connectors._compat import (
            blocks_of_rows,
            dataset_preserving_order,
            dataset_sorting_shuffle,
        )

        tasks = tasks or DatasetTasks()
        keys_hash = self._key_hash
        key = _HASH_COLUMN
        refuse = self._refuse_hash_column

        def add_key(batch: pa.Table) -> pa.Table:
            refuse(batch.column_names)
            bucket = keys_hash(batch).to_numpy() % np.uint64(DEDUP_BUCKETS)
            return batch.append_column(key, pa.array(bucket.astype(np.int64)))

        dedup = self

        def per_group(group: pa.Table) -> pa.Table:
            return dedup(group.drop_columns([key]))

        # Group by a bucket of a 64-bit hash of the keys (one scalar, nulls
        # allowed); exact comparison of the real key columns happens within each
        # bucket, so equal keys, which share a bucket, are always compared.
        # Ray's sort-based shuffle hands the buckets over in key order, so the
        # rows come out by bucket, each bucket's in (_sf_file, _sf_row) order,
        # whatever order the blocks arrive in (kept: preserve_order); cutting
        # them into blocks of DEDUP_BLOCK_ROWS in that order then fixes what
        # each block holds, as the shuffle's sampled range boundaries would not.
        ordered = dataset_preserving_order(dataset_sorting_shuffle(ds))
        keyed = tasks.map_batches(ordered, add_key,
                                  what=f"transform {self.name} (hashing the keys)",
                                  batch_format="pyarrow")
        deduped = tasks.map_groups(keyed.groupby(key, num_partitions=self.partitions), per_group,
                                   what=f"transform {self.name} (one row per key)",
                                   batch_format="pyarrow")
        return blocks_of_rows(deduped, DEDUP_BLOCK_ROWS)
