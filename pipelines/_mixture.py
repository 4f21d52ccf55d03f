"""Deterministic weighted mixtures of several sources.

:func:`interleave` takes datasets read with provenance (``_sf_file``,
``_sf_row``) and returns one dataset whose rows come from the sources in the
given proportions, in an order fixed by the seed:

1. **How many rows per source.** With proportions ``p_i = w_i / sum(w)`` and
   ``n_i`` good rows in source ``i``, the mixture has ``T = min_i n_i / p_i``
   rows (the first source to run out ends it) and takes ``floor(p_i * T)``
   rows of each source: its first good rows in (file name, row) order. Bad
   records (rows marked by a reader) take no share: they go with the good row
   after them, so they are counted (and quarantined) where they stand.
2. **In which order.** Row ``k`` of source ``i`` gets the key
   ``(k + u) / p_i`` with ``u`` in [0, 1) hashed from (seed, source, k)
   (jittered stride scheduling): sorted by key, each source keeps its order
   and every prefix of the mixture holds each source in proportion ``p_i`` to
   within one row. One Ray ``sort`` does the merge.

Only row counts per file, the rows of bad records and schemas travel to the
driver (one small Ray pass over all sources), never rows; the mixed dataset reads the sources again. ``_sf_file`` becomes ``<source name>/<file>`` so rows of
different sources keep distinct identities for seeded transforms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import (
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    MissingColumnError,
    SpecError,
    short_repr,
)
from slicefeed.connectors._compat import dataset_sorting_shuffle
from slicefeed.connectors._names import ERROR_COLUMN, RAW_COLUMN
from slicefeed.pipelines._spec import MAX_WEIGHT
from slicefeed.transforms._hashing import GOLDEN, mix64
from slicefeed.transforms._hashing import str_hash64 as _str_hash64

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

_KEY = "__sf_mix_key"
#: About this many rows per block of a mixed dataset.
MIX_BLOCK_ROWS = 4096
_SRC = "__sf_mix_src"
#: A record's place among its source's records in (file, row) order: the last
#: sort key, so records that tie on the first two (the bad records that go with
#: one good row) come out in the order they stand, whatever order blocks arrive in.
_ORD = "__sf_mix_ord"


class _Sizes:
    """Per block: rows per file (max ``_sf_row`` + 1), the rows of its bad
    records, and the block's schema."""

    def __init__(self, index: int):
        self.index = index

    def __call__(self, batch: pa.Table) -> pa.Table:
        # The schema of the source's data: bad records' columns (error, raw bytes)
        # left out, and none from a block of bad records only, which has no data
        # columns (a source's first file may be all bad records).
        data = batch.drop_columns([c for c in (ERROR_COLUMN, RAW_COLUMN) if c in batch.column_names])
        schema = (None if ERROR_COLUMN in batch.column_names and set(data.column_names)
                  <= {PROVENANCE_FILE, PROVENANCE_ROW} else data.schema.serialize().to_pybytes())
        if not all(c in batch.column_names for c in (PROVENANCE_FILE, PROVENANCE_ROW)):
            return pa.table({"src": [self.index], "f": pa.array([None], pa.string()),
                             "m": pa.array([-1], pa.int64()),
                             "bad": pa.array([[]], pa.list_(pa.int64())),
                             "schema": pa.array([schema], pa.binary())})
        rows = batch.select([PROVENANCE_FILE, PROVENANCE_ROW])
        g = rows.group_by(PROVENANCE_FILE, use_threads=False).aggregate([(PROVENANCE_ROW, "max")])
        files = g.column(PROVENANCE_FILE).cast(pa.string())
        bad: dict[str, list[int]] = {}  # the rows of bad records, per file
        if ERROR_COLUMN in batch.column_names:
            marked = rows.filter(pc.is_valid(batch.column(ERROR_COLUMN)))
            if marked.num_rows:
                per = marked.group_by(PROVENANCE_FILE, use_threads=False).aggregate(
                    [(PROVENANCE_ROW, "list")])
                bad = dict(zip(per.column(PROVENANCE_FILE).cast(pa.string()).to_pylist(),
                               per.column(f"{PROVENANCE_ROW}_list").to_pylist()))
        n = g.num_rows
        return pa.table(
            {
                "src": pa.array([self.index] * n, pa.int64()),
                "f": files,
                "m": g.column(f"{PROVENANCE_ROW}_max").cast(pa.int64()),
                "bad": pa.array([[r for r in bad.get(f, ()) if r is not None]
                                 for f in files.to_pylist()], pa.list_(pa.int64())),
                "schema": pa.array([schema] * n, pa.binary()),
            }
        )


def _survey(dss: Sequence[ray.data.Dataset]
            ) -> tuple[list[dict[str, int]], list[dict[str, np.ndarray]], list[pa.Schema | None]]:
    """Records per file, the sorted rows of the bad ones per file, and the
    schema of every source, in one Ray execution.

    Blocks arrive in the order their tasks finish, which differs between runs,
    so nothing taken from them may depend on it: a source's schema is that of
    its first block in (file, row) order, not of the first block to arrive (its
    files may differ in types, and the schema check would then pass on one run
    and fail on another).
    """
    parts = [ds.map_batches(_Sizes(i), batch_format="pyarrow", batch_size=None) for i, ds in enumerate(dss)]
    merged = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    sizes: list[dict[str, int]] = [{} for _ in dss]
    bad: list[dict[str, list[int]]] = [{} for _ in dss]
    first: list[tuple[tuple[str, int], bytes] | None] = [None] * len(dss)
    for b in merged.iter_batches(batch_format="pyarrow", batch_size=None):
        cols = b.to_pydict()
        for i, f, m, rows, sch in zip(cols["src"], cols["f"], cols["m"], cols["bad"], cols["schema"]):
            # A block's last row of a file orders the blocks of that file.
            at = (f or "", -1 if m is None else int(m))
            if sch is not None and (first[i] is None or at < first[i][0]):
                first[i] = (at, sch)
            if f is not None:
                # A file the reader could not read at all has no rows (its one
                # marker, a null row, fails the run with the file named).
                sizes[i][f] = max(sizes[i].get(f, 0), 0 if m is None else int(m) + 1)
                if rows:
                    bad[i].setdefault(f, []).extend(rows)
    schemas = [None if x is None else pa.ipc.read_schema(pa.py_buffer(x[1])) for x in first]
    return sizes, [{f: np.unique(np.asarray(r, np.int64)) for f, r in b.items()} for b in bad], schemas


def _rank(offset: int, bad: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """The rank of rows ``rows`` of one file among its source's good rows in
    (file, row) order: ``offset`` (the good rows of the files before it) plus
    the rows before each in its file, less the file's bad rows before it
    (``bad``: their sorted rows). A bad record gets the rank of the good row
    after it, the one it goes with (kept, and keyed, with that row)."""
    rank = offset + rows
    if bad is not None and bad.size:
        rank = rank - np.searchsorted(bad, rows)
    return rank


def plan_counts(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Rows taken from each source: ``floor(p_i * min_j n_j / p_j)``, capped at ``n_i``.

    Computed exactly from the weights' float values (rationals, not floats):
    ``p_i * T == min_j n_j * w_i / w_j``, so a product just below an integer
    is floored and an exact one (``n_i`` for the first source to run out) is not.
    """
    w = [Fraction(float(x)) for x in weights]
    total = min(Fraction(n) / wj for n, wj in zip(sizes, w))
    return [int(min(n, math.floor(wi * total))) for n, wi in zip(sizes, w)]


def interleave(
    datasets: Sequence[ray.data.Dataset] | Mapping[str, ray.data.Dataset],
    weights: Sequence[float],
    *,
    seed: int = 0,
    read: dict[str, dict[str, int]] | None = None,
) -> tuple[ray.data.Dataset, dict[str, int]]:
    """Mixes ``datasets`` in proportion to ``weights``, deterministically by ``seed``.

    Args:
        datasets: Datasets with the same schema, read with provenance; a list
            (sources named ``"0"``, ``"1"``, ...) or a mapping name -> dataset.
        weights: One positive weight per dataset.
        seed: Fixes the interleaving order.
        read: Filled, when given, with ``{name: {"rows_read": r, "rows_not_taken":
            u}}``: the records of each source the mixture takes (its good rows
            taken and the bad records among them) and those past its quota.

    Returns:
        ``(dataset, counts)``: the lazy mixed dataset and the number of rows
        taken from each source, by name (for the run report).

    Raises:
        SpecError: on mismatched lengths, non-positive weights, an empty
            source, missing provenance columns or different schemas.
    """
    if isinstance(datasets, Mapping):
        names = [str(k) for k in datasets]
        dss = list(datasets.values())
    else:
        dss = list(datasets)
        names = [str(i) for i in range(len(dss))]
    if not dss:
        raise SpecError("interleave: give at least one dataset")
    if len(weights) != len(dss):
        raise SpecError(
            f"interleave: {len(dss)} datasets but {len(weights)} weights; give one weight per source"
        )
    for name, w in zip(names, weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w <= MAX_WEIGHT):
            raise SpecError(f"interleave: weight of source {short_repr(name)} must be a positive "
                            f"number of at most {MAX_WEIGHT:g}; got {short_repr(w)}")
    file_sizes, file_bad, schemas = _survey(dss)
    # Weights apply to good rows: a source's bad records are mixed in where they
    # stand and counted as bad, but take none of its share.
    file_good = [{f: n - len(bad.get(f, ())) for f, n in fs.items()}
                 for fs, bad in zip(file_sizes, file_bad)]
    records = [sum(fs.values()) for fs in file_sizes]
    sizes = [sum(fs.values()) for fs in file_good]
    # A source without a schema but with rows holds bad records only: they are
    # mixed in and counted as bad like any others.
    for name, s, n in zip(names, schemas, records):
        if s is None and n == 0:
            raise SpecError(f"interleave: source {name!r} is empty; a mixture needs rows from every source")
        missing = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW) if s is not None and c not in s.names]
        if missing:
            raise MissingColumnError(
                f"interleave: source {name!r} lacks the provenance columns {missing}; read it "
                "with provenance=True"
            )
    known = [(name, s) for name, s in zip(names, schemas) if s is not None]
    if not known:
        raise SpecError("interleave: every record of every source is bad; there is nothing to mix")
    first, base = known[0]
    for name, s in known[1:]:
        if s.names != base.names or s.types != base.types:
            raise SpecError(
                f"interleave: source {name!r} has columns "
                f"{', '.join(f'{f.name}: {f.type}' for f in s)}; source {first!r} has "
                f"{', '.join(f'{f.name}: {f.type}' for f in base)}. Mixed sources need "
                "the same schema (select/cast them first)."
            )
    for name, n, good in zip(names, records, sizes):
        if n == 0:
            raise SpecError(f"interleave: source {name!r} is empty; a mixture needs rows from every source")
        if good == 0:
            raise SpecError(f"interleave: every record of source {name!r} is bad; a mixture "
                            "needs rows from every source")
    counts = plan_counts(sizes, weights)
    w = np.asarray(weights, dtype=np.float64)
    p = w / w.sum()
    salts = [_str_hash64(f"mixture/{seed}/{i}") for i in range(len(dss))]
    parts = []
    offsets_of: list[dict[str, int]] = []
    for i, (ds, good) in enumerate(zip(dss, file_good)):
        files = sorted(good)
        offsets = dict(zip(files, np.cumsum([0] + [good[f] for f in files])[:-1].tolist()))
        offsets_of.append(offsets)
        before = dict(zip(files, np.cumsum([0] + [file_sizes[i][f] for f in files])[:-1].tolist()))
        parts.append(
            ds.map_batches(
                _Keyer(names[i], i, offsets, file_bad[i], counts[i], float(p[i]), salts[i],
                       whole=counts[i] >= sizes[i], records_before=before),
                batch_format="pyarrow",
            )
        )
    if read is not None:
        for i, name in enumerate(names):
            taken = records[i]
            if counts[i] < sizes[i]:
                # Bad records go with the good row after them (see _rank).
                bad_taken = 0
                for f, rows in file_bad[i].items():
                    rank = _rank(offsets_of[i].get(f, 0), rows, rows)
                    bad_taken += int((rank < counts[i]).sum())
                taken = counts[i] + bad_taken
            read[name] = {"rows_read": taken, "rows_not_taken": records[i] - taken}
    mixed = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    # Ray's sort-based shuffle: tasks, where Ray 2.60's default hash shuffle
    # starts actors for every sort (5-8 s fixed on a small cluster); the order
    # is the sort keys' either way.
    mixed = dataset_sorting_shuffle(mixed)
    # Ray's sort samples its range boundaries, so the sizes of its output blocks
    # (not their rows' order) differ from run to run; a transform whose output
    # depends on batch boundaries (pack_sequences) would then differ too. A split
    # into a number of blocks fixed by the counts (about MIX_BLOCK_ROWS rows each,
    # split evenly in sort order) gives every run the same blocks and batches.
    mixed = (mixed.sort([_KEY, _SRC, _ORD])
             .repartition(max(1, -(-sum(counts) // MIX_BLOCK_ROWS)), shuffle=False)
             .map_batches(_drop_keys, batch_format="pyarrow"))
    return mixed, dict(zip(names, counts))


class _Keyer:
    """Adds the mixture sort key to a source's rows and drops rows past its quota.

    A good row's rank (:func:`_rank`) is its place among the source's good rows in (file, row)
    order (``offsets``: good rows before each file; ``bad``: each file's sorted
    bad rows). A bad record goes with the good row after it: kept while that
    row is within the quota, keyed just before it (it is counted, never written);
    those after a source's last good row are kept when the mixture takes the
    whole source (``whole``). A file's marker (a null row: the file could not
    be read) is always kept, so the run fails naming it. ``records_before``:
    the records (good and bad) of the files before each, for :data:`_ORD`.
    """

    def __init__(self, name: str, index: int, offsets: dict[str, int],
                 bad: dict[str, np.ndarray], count: int, p: float, salt: int,
                 whole: bool = False, records_before: dict[str, int] | None = None):
        self.name, self.index, self.offsets, self.bad = name, index, offsets, bad
        self.count, self.p, self.salt, self.whole = count, p, salt, whole
        self.records_before = records_before or {}

    def __call__(self, batch: pa.Table) -> pa.Table:
        files = batch.column(PROVENANCE_FILE)
        enc = pc.dictionary_encode(files).combine_chunks()
        names = enc.dictionary.to_pylist()
        codes = enc.indices.to_numpy()
        rows = batch.column(PROVENANCE_ROW)
        marker = pc.is_null(rows).to_numpy(zero_copy_only=False)
        row = pc.fill_null(rows, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        base = np.array([self.offsets.get(f, 0) for f in names], np.int64)
        rank = base[codes] + row
        order = np.array([self.records_before.get(f, 0) for f in names], np.int64)[codes] + row
        for k, f in enumerate(names):  # files with bad records only
            marked = self.bad.get(f)
            if marked is not None and marked.size:
                at = codes == k
                rank[at] = _rank(int(base[k]), marked, row[at])
        is_bad = (pc.is_valid(batch.column(ERROR_COLUMN)).to_numpy(zero_copy_only=False)
                  if ERROR_COLUMN in batch.column_names else np.zeros(len(row), bool))
        keep = (rank < self.count) | marker | (is_bad & self.whole)
        batch = batch.filter(pa.array(keep))
        rank, is_bad, marker, order = rank[keep], is_bad[keep], marker[keep], order[keep]
        # Per-row jitter in [0, 1) from (seed, source, rank): keeps each source's
        # order and the +-1 prefix guarantee, and lets the seed shape the order.
        with np.errstate(over="ignore"):
            h = mix64(np.uint64(self.salt) ^ (rank.astype(np.uint64) * GOLDEN))
        jitter = (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        key = (rank.astype(np.float64) + jitter) / self.p
        # A bad record just before the good row of its rank (bad records of one
        # rank are put in their own order by _ORD).
        key[is_bad] = (rank[is_bad] - 0.5) / self.p
        key[marker] = -1.0
        named = pc.binary_join_element_wise(self.name, batch.column(PROVENANCE_FILE), "/")
        batch = batch.set_column(batch.column_names.index(PROVENANCE_FILE), PROVENANCE_FILE, named)
        batch = batch.append_column(_KEY, pa.array(key))
        batch = batch.append_column(_SRC, pa.array(np.full(len(key), self.index, np.int32)))
        return batch.append_column(_ORD, pa.array(order))


def _drop_keys(batch: pa.Table) -> pa.Table:
    return batch.drop_columns([c for c in (_KEY, _SRC, _ORD) if c in batch.column_names])


def mixture_report(counts: Mapping[str, int], weights: Sequence[float]) -> dict[str, Any]:
    """Per source: rows taken, weight as given, its normalised ``proportion`` and
    the realised fraction of the mixture, for the run report."""
    total = sum(counts.values())
    w = np.asarray(weights, dtype=np.float64)
    return {
        name: {"rows": n, "weight": float(wi), "proportion": float(pi),
               "fraction": (n / total) if total else 0.0}
        for (name, n), wi, pi in zip(counts.items(), w, w / w.sum())
    }
