"""Sequence packing into fixed-length rows for TPUs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from slicefeed.connectors import ERROR_COLUMN, PROVENANCE_FILE, PROVENANCE_ROW, short_repr
from slicefeed.transforms._arrays import (
    MAX_ROW_LENGTH,
    list_parts,
    make_tensor,
    null_value_rows,
    segment_arange,
    tensor_type,
)
from slicefeed.transforms._contract import Transform

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

STRATEGIES = ("first_fit", "best_fit", "concat")
OVERFLOW = ("split", "truncate")


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """First-fit bin packing in input order.

    Returns:
        ``(bin, offset)`` per item: the bin index and the item's start in it.
    """
    n = len(lengths)
    rem = np.empty(max(n, 1), dtype=np.int64)
    bins = np.empty(n, dtype=np.int64)
    offs = np.empty(n, dtype=np.int64)
    open_ = 0
    lo = 0  # bins before lo are full
    # One NumPy scan over the non-full open bins per item; the token copy is vectorised.
    for i, ln in enumerate(lengths.tolist()):
        if lo < open_:
            fits = rem[lo:open_] >= ln
            j = int(fits.argmax())
            b = lo + j if fits[j] else open_
        else:
            b = open_
        if b == open_:
            rem[open_] = capacity
            open_ += 1
        bins[i] = b
        offs[i] = capacity - rem[b]
        rem[b] -= ln
        while lo < open_ and rem[lo] == 0:
            lo += 1
    return bins, offs


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing: longest first, each into the fullest bin it fits.

    Within a bin, items keep their placement order.
    """
    n = len(lengths)
    order = np.argsort(-lengths, kind="stable")
    rem = np.empty(max(n, 1), dtype=np.int64)
    bins = np.empty(n, dtype=np.int64)
    offs = np.empty(n, dtype=np.int64)
    open_ = 0
    big = np.iinfo(np.int64).max
    for i in order.tolist():
        ln = int(lengths[i])
        r = rem[:open_]
        cand = np.where(r >= ln, r, big)
        b = int(np.argmin(cand)) if open_ else 0
        if not open_ or cand[b] == big:
            b = open_
            rem[open_] = capacity
            open_ += 1
        bins[i] = b
        offs[i] = capacity - rem[b]
        rem[b] -= ln
    return bins, offs


def pack_plan(lengths: np.ndarray, capacity: int, strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """``(bin, offset)`` per item for ``first_fit`` or ``best_fit``.

    ``best_fit`` runs best-fit decreasing and keeps first-fit's plan instead
    when that one needs fewer bins, so its efficiency is never below
    first-fit's on the same batch.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ff = first_fit(lengths, capacity)
    if strategy == "first_fit":
        return ff
    bf = best_fit_decreasing(lengths, capacity)
    return ff if ff[0].max() < bf[0].max() else bf


def packing_efficiency(segment_ids: np.ndarray) -> float:
    """Fraction of non-padding positions (``segment_ids != 0``)."""
    s = np.asarray(segment_ids)
    return float((s != 0).sum() / s.size) if s.size else 0.0


@dataclasses.dataclass(frozen=True)
class PackSequences(Transform):
    """Packs variable-length token lists into rows of exactly ``seq_len`` tokens.

    Output columns (each an ``arrow.fixed_shape_tensor`` of int32, shape
    ``(seq_len,)``: a dense ``(rows, seq_len)`` array for Arrow, NumPy and Ray
    Data consumers alike): ``tokens``,
    ``segment_ids`` (1, 2, ... per sequence in the row; 0 = padding) and
    ``positions`` (0, 1, ... restarting at each segment). Other columns are
    dropped, except ``_sf_file``/``_sf_row`` of each row's first segment.
    With ``overflow: truncate`` an int32 column ``truncated_tokens`` counts the
    tokens cut from the row's sequences, so nothing is lost silently.

    Strategies (per batch; batch boundaries are part of the plan, so give the
    pipeline a fixed ``batch_size`` for reproducible packing):

    - ``first_fit``: each sequence into the first row with room, input order.
    - ``best_fit``: best-fit decreasing (never less efficient than first_fit on
      the same batch: the better of the two plans is kept).
    - ``concat``: concatenate all sequences and cut every ``seq_len`` tokens;
      a sequence cut at a row boundary continues as a new segment.

    Sequences longer than ``seq_len`` are split into ``seq_len`` pieces
    (``overflow: split``, each piece its own segment) or truncated
    (``overflow: truncate``). A null list, a list holding a null token id,
    and a list holding a token id outside int32 (the packed tokens' type: any
    list<integer> is read, and an id is never wrapped) mark their row bad.
    An empty list holds no token and so adds no segment; the run report's
    ``reshaped`` entry counts the rows going in and coming out.

    Args:
        column: Input ``list<int>`` column (a ``fixed_size_list`` or
            one-dimensional tensor column is read the same way).
        seq_len: Output row length (at most ``2**20``).
        strategy: ``first_fit``, ``best_fit`` or ``concat``.
        overflow: ``split`` or ``truncate``.
        pad_id: Token id used for padding (an integer within int32).
    """

    name: ClassVar[str] = "pack_sequences"
    reshapes_rows: ClassVar[bool] = True
    column: str = "tokens"
    seq_len: int = 2048
    strategy: str = "first_fit"
    overflow: str = "split"
    pad_id: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise self._spec_error(f"seq_len must be a positive integer; got {short_repr(self.seq_len)}")
        if self.seq_len > MAX_ROW_LENGTH:
            raise self._spec_error(
                f"seq_len must be at most {MAX_ROW_LENGTH} (every packed row is allocated at "
                f"this length); got {short_repr(self.seq_len)}"
            )
        if self.strategy not in STRATEGIES:
            raise self._spec_error(
                f"unknown strategy {short_repr(self.strategy)}; allowed: {', '.join(STRATEGIES)}"
            )
        if self.overflow not in OVERFLOW:
            raise self._spec_error(
                f"unknown overflow {short_repr(self.overflow)}; allowed: {', '.join(OVERFLOW)}"
            )
        if (
            isinstance(self.pad_id, bool)
            or not isinstance(self.pad_id, int)
            or not _INT32.min <= self.pad_id <= _INT32.max
        ):
            raise self._spec_error(
                f"pad_id {short_repr(self.pad_id)} is not an integer in int32 "
                f"[{_INT32.min}, {_INT32.max}] (the packed tokens' type); give a token id in that range"
            )

    def _out_fields(self) -> list[pa.Field]:
        t = tensor_type(pa.int32(), (self.seq_len,))
        fs = [pa.field("tokens", t), pa.field("segment_ids", t), pa.field("positions", t)]
        if self.overflow == "truncate":
            fs.append(pa.field("truncated_tokens", pa.int32()))
        return fs

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        self._require(schema, self.column, kinds=("list<integer>",))
        fields = self._out_fields()
        fields += [schema.field(c) for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c in schema.names]
        return pa.schema(fields)

    def __call__(self, table: pa.Table) -> pa.Table:
        S = self.seq_len
        col = table.column(self.column)
        values, offsets, valid = list_parts(col)
        n = len(valid)
        reasons = np.full(n, None, dtype=object)
        reasons[~valid] = f"PackSequences: column {short_repr(self.column)} is null"
        held_null = null_value_rows(col)
        reasons[held_null] = (
            f"PackSequences: column {short_repr(self.column)} holds a null token id; "
            "fill or drop it before pack_sequences"
        )
        outside = _rows_outside_int32(values, offsets) & ~held_null
        reasons[outside] = (
            f"PackSequences: column {short_repr(self.column)} holds a token id outside int32 "
            "(the packed tokens' type); fix the ids, or map them into int32 before pack_sequences"
        )
        bad = ~valid | held_null | outside
        # Bad rows pack nothing (their offsets stay, so other rows' sources do too).
        lengths = np.where(bad, 0, np.diff(offsets))
        # Items: (source row, start in row, length), after split/truncate.
        if self.overflow == "split":
            pieces = np.where(lengths > 0, (lengths + S - 1) // S, 0)
            item_row = np.repeat(np.arange(n), pieces)
            k = segment_arange(pieces)
            item_start = k * S
            item_len = np.minimum(lengths[item_row] - item_start, S)
            truncated = np.zeros(n, np.int64)
        else:
            item_row = np.flatnonzero(lengths > 0)
            item_start = np.zeros(len(item_row), np.int64)
            item_len = np.minimum(lengths[item_row], S)
            truncated = lengths - np.minimum(lengths, S)
        if self.strategy == "concat":
            flat_start = np.concatenate([[0], np.cumsum(item_len)])[:-1]
            # Cut items at row boundaries: a piece crossing one continues as a new segment.
            first_bin = flat_start // S
            last_bin = (flat_start + item_len - 1) // S
            nparts = last_bin - first_bin + 1
            part_item = np.repeat(np.arange(len(item_len)), nparts)
            part_bin = first_bin[part_item] + segment_arange(nparts)
            lo = np.maximum(flat_start[part_item], part_bin * S)
            hi = np.minimum(flat_start[part_item] + item_len[part_item], (part_bin + 1) * S)
            part_len = hi - lo
            part_src = offsets[item_row[part_item]] + item_start[part_item] + (lo - flat_start[part_item])
            bins, offs = part_bin, lo - part_bin * S
            seg_row = item_row[part_item]
            lens, srcs = part_len, part_src
            counts_once = segment_arange(nparts) == 0
        else:
            bins, offs = pack_plan(item_len, S, self.strategy)
            lens = item_len
            srcs = offsets[item_row] + item_start
            seg_row = item_row
            counts_once = np.ones(len(bins), bool)
        n_bins = int(bins.max()) + 1 if len(bins) else 0
        tokens = np.full(n_bins * S, self.pad_id, dtype=np.int32)
        seg = np.zeros(n_bins * S, dtype=np.int32)
        pos = np.zeros(n_bins * S, dtype=np.int32)
        # Segment number within its bin: order items by (bin, offset).
        order = np.lexsort((offs, bins))
        seg_no = np.empty(len(bins), np.int64)
        if len(bins):
            sb = bins[order]
            starts = np.r_[0, np.flatnonzero(np.diff(sb)) + 1]
            run = np.diff(np.r_[starts, len(sb)])
            seg_no[order] = segment_arange(run) + 1
        # Items fill each row from offset 0 without gaps, so in (bin, offset)
        # order the content positions are "every position before the row's
        # padding": one boolean mask instead of per-token destination indices.
        lens_o = lens[order]
        total = int(lens_o.sum())
        starts_o = np.cumsum(lens_o) - lens_o
        it = np.arange(total, dtype=np.int64)
        used = np.bincount(bins, weights=lens, minlength=n_bins).astype(np.int64)
        content = (np.arange(S)[None, :] < used[:, None]).reshape(-1)
        tokens[content] = values[it + np.repeat(srcs[order] - starts_o, lens_o)]
        seg[content] = np.repeat(seg_no[order].astype(np.int32), lens_o)
        pos[content] = it - np.repeat(starts_o, lens_o)
        cols: dict[str, pa.Array] = {
            "tokens": make_tensor(tokens, (S,)),
            "segment_ids": make_tensor(seg, (S,)),
            "positions": make_tensor(pos, (S,)),
        }
        # Each output row's first segment names its provenance.
        first_row = np.zeros(n_bins, np.int64)
        if len(bins):
            is_first = seg_no == 1
            first_row[bins[is_first]] = seg_row[is_first]
        if self.overflow == "truncate":
            tr = np.zeros(n_bins, np.int64)
            # A sequence cut by concat spans rows: count its loss once.
            np.add.at(tr, bins[counts_once], truncated[seg_row[counts_once]])
            cols["truncated_tokens"] = pa.array(tr.astype(np.int32))
        for c in (PROVENANCE_FILE, PROVENANCE_ROW):
            if c in table.column_names:
                cols[c] = table.column(c).take(pa.array(first_row))
        out = pa.Table.from_pydict(cols, schema=self._schema_for(table))
        if bad.any():
            out = _append_bad_rows(out, table, bad, reasons)
        return out

    def _schema_for(self, table: pa.Table) -> pa.Schema:
        fields = self._out_fields()
        fields += [table.schema.field(c) for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c in table.column_names]
        return pa.schema(fields)

    def output_stats(self, ds: ray.data.Dataset) -> dict[str, Any]:
        """Packing efficiency of the packed dataset ``ds`` (one aggregation pass).

        Returns:
            ``{"rows", "tokens", "pad_tokens", "efficiency"}`` (plus
            ``truncated_tokens`` with ``overflow: truncate``).
        """

        def count(batch: pa.Table) -> pa.Table:
            s, _, _ = list_parts(batch.column("segment_ids"))
            d = {"rows": [batch.num_rows], "tokens": [int((s != 0).sum())], "slots": [int(s.size)]}
            if "truncated_tokens" in batch.column_names:
                d["truncated_tokens"] = [int(np.asarray(batch.column("truncated_tokens")).sum())]
            return pa.table(d)

        parts = ds.select_columns(
            ["segment_ids", *(["truncated_tokens"] if self.overflow == "truncate" else [])]
        ).map_batches(count, batch_format="pyarrow")
        totals = {k: 0 for k in ("rows", "tokens", "slots", "truncated_tokens")}
        for b in parts.iter_batches(batch_format="pyarrow", batch_size=None):
            for k in totals:
                if k in b.column_names:
                    totals[k] += int(np.asarray(b.column(k)).sum())
        out: dict[str, Any] = {
            "rows": totals["rows"],
            "tokens": totals["tokens"],
            "pad_tokens": totals["slots"] - totals["tokens"],
            "efficiency": totals["tokens"] / totals["slots"] if totals["slots"] else 0.0,
        }
        if self.overflow == "truncate":
            out["truncated_tokens"] = totals["truncated_tokens"]
        return out


_INT32 = np.iinfo(np.int32)


def _rows_outside_int32(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Rows (by ``list_parts`` offsets) holding a value outside int32."""
    n = len(offsets) - 1
    kind, size = values.dtype.kind, values.dtype.itemsize
    if kind not in "iu" or (kind == "i" and size <= 4) or (kind == "u" and size <= 2):
        return np.zeros(n, dtype=bool)
    outside = values > _INT32.max if kind == "u" else (values < _INT32.min) | (values > _INT32.max)
    bad = np.zeros(n, dtype=bool)
    if outside.any():
        bad[np.repeat(np.arange(n), np.diff(offsets))[outside]] = True
    return bad


def _append_bad_rows(out: pa.Table, table: pa.Table, bad: np.ndarray, reasons: np.ndarray) -> pa.Table:
    """One placeholder row per bad input row, marked in ``_sf_error`` with its reason."""
    idx = pa.array(np.flatnonzero(bad))
    k = len(idx)
    cols: dict[str, pa.Array] = {}
    for f in out.schema:
        if f.name in (PROVENANCE_FILE, PROVENANCE_ROW):
            cols[f.name] = table.column(f.name).take(idx)
        else:
            cols[f.name] = pa.nulls(k, f.type)
    bad_rows = pa.Table.from_pydict(cols, schema=out.schema)
    bad_rows = bad_rows.append_column(pa.field(ERROR_COLUMN, pa.string()), pa.array(reasons[bad], pa.string()))
    good = out.append_column(pa.field(ERROR_COLUMN, pa.string()), pa.nulls(out.num_rows, pa.string()))
    return pa.concat_tables([good, bad_rows])
