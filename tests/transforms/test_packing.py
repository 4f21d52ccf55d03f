"""PackSequences: property-based checks (hypothesis) and edge cases."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slicefeed.connectors import BadRecordError, SpecError
from slicefeed.transforms import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    PackSequences,
    apply_transforms,
    packing_efficiency,
    split_errors,
    transform_from_spec,
)
from slicefeed.transforms._packing import best_fit_decreasing, first_fit

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _source(lengths: list[int]) -> tuple[pa.Table, list[np.ndarray]]:
    """Sequences whose tokens are globally unique (1, 2, 3, ...), so every output
    token names its source sequence and position."""
    seqs, nxt = [], 1
    for n in lengths:
        seqs.append(np.arange(nxt, nxt + n, dtype=np.int32))
        nxt += n
    table = pa.table(
        {
            "tokens": pa.array([s.tolist() for s in seqs], pa.list_(pa.int32())),
            PROVENANCE_FILE: ["f.jsonl"] * len(seqs),
            PROVENANCE_ROW: pa.array(range(len(seqs)), pa.int64()),
        }
    )
    return table, seqs


def _dense(out: pa.Table, name: str, seq_len: int) -> np.ndarray:
    col = out.column(name).combine_chunks()
    assert col.type == pa.fixed_shape_tensor(pa.int32(), (seq_len,))
    return col.to_numpy_ndarray().reshape(-1, seq_len)


def _segments(out: pa.Table, seq_len: int):
    tok, seg, pos = (_dense(out, c, seq_len) for c in ("tokens", "segment_ids", "positions"))
    for r in range(tok.shape[0]):
        ids = seg[r]
        nz = ids[ids != 0]
        # Segments are numbered 1..k left to right, padding only at the end.
        k = int(nz.max()) if nz.size else 0
        assert (ids[: nz.size] != 0).all() and (ids[nz.size :] == 0).all()
        assert sorted(set(nz.tolist())) == list(range(1, k + 1))
        assert (np.diff(nz) >= 0).all()
        assert (tok[r][ids == 0] == 0).all() and (pos[r][ids == 0] == 0).all()
        for s in range(1, k + 1):
            m = ids == s
            np.testing.assert_array_equal(pos[r][m], np.arange(m.sum()))
            yield r, tok[r][m]


lengths_st = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=40)


@SETTINGS
@given(lengths=lengths_st, seq_len=st.integers(1, 24), strategy=st.sampled_from(["first_fit", "best_fit", "concat"]))
def test_split_loses_and_duplicates_nothing(lengths, seq_len, strategy):
    table, seqs = _source(lengths)
    out = PackSequences(seq_len=seq_len, strategy=strategy)(table)
    assert out.schema == PackSequences(seq_len=seq_len, strategy=strategy).output_schema(table.schema)
    pieces = list(_segments(out, seq_len))
    # Every segment is a contiguous run of one source sequence (tokens are unique
    # and consecutive within a sequence).
    for _, seg in pieces:
        assert seg.size >= 1 and (np.diff(seg) == 1).all()
    allt = np.concatenate([p for _, p in pieces]) if pieces else np.zeros(0, np.int32)
    expect = np.concatenate(seqs) if seqs else np.zeros(0, np.int32)
    np.testing.assert_array_equal(np.sort(allt), expect)  # no token lost or duplicated
    # Pieces of one sequence concatenate back to it, in order.
    starts = np.cumsum([0] + lengths)
    for i, s in enumerate(seqs):
        if len(s) == 0:
            continue
        mine = sorted((p[0], p) for _, p in pieces if starts[i] < p[0] <= starts[i + 1])
        np.testing.assert_array_equal(np.concatenate([p for _, p in mine]), s)
    rows = _dense(out, "tokens", seq_len).shape[0]
    total = int(sum(lengths))
    assert rows >= -(-total // seq_len)
    if strategy == "concat":
        assert rows == -(-total // seq_len)


@SETTINGS
@given(lengths=lengths_st, seq_len=st.integers(1, 24))
def test_best_fit_never_less_efficient_than_first_fit(lengths, seq_len):
    table, _ = _source(lengths)
    ff = PackSequences(seq_len=seq_len, strategy="first_fit")(table)
    bf = PackSequences(seq_len=seq_len, strategy="best_fit")(table)
    e_ff = packing_efficiency(_dense(ff, "segment_ids", seq_len))
    e_bf = packing_efficiency(_dense(bf, "segment_ids", seq_len))
    assert e_bf >= e_ff
    assert bf.num_rows <= ff.num_rows


@SETTINGS
@given(lengths=st.lists(st.integers(1, 30), max_size=30), cap=st.integers(30, 40))
def test_plans_respect_capacity(lengths, cap):
    lengths = np.array(lengths, np.int64)
    for plan in (first_fit(lengths, cap), best_fit_decreasing(lengths, cap)):
        bins, offs = plan
        for b in np.unique(bins):
            m = bins == b
            order = np.argsort(offs[m])
            o, ln = offs[m][order], lengths[m][order]
            # Items in a bin are disjoint and inside [0, cap).
            assert o[0] == 0 and (o[1:] == (o + ln)[:-1]).all() and (o + ln)[-1] <= cap


@SETTINGS
@given(lengths=lengths_st, seq_len=st.integers(1, 24), strategy=st.sampled_from(["first_fit", "best_fit", "concat"]))
def test_truncate_counts_what_it_cuts(lengths, seq_len, strategy):
    table, seqs = _source(lengths)
    out = PackSequences(seq_len=seq_len, strategy=strategy, overflow="truncate")(table)
    pieces = list(_segments(out, seq_len))
    kept = sum(p.size for _, p in pieces)
    truncated = int(np.asarray(out.column("truncated_tokens")).sum()) if out.num_rows else 0
    assert kept + truncated == sum(lengths)
    assert kept == sum(min(n, seq_len) for n in lengths)
    # Each sequence keeps its prefix.
    for _, p in pieces if strategy != "concat" else []:
        assert any(p[0] == s[0] for s in seqs if len(s))


def test_known_packing_and_provenance():
    table, _ = _source([3, 5, 2, 4])
    out = PackSequences(seq_len=8, strategy="first_fit")(table)
    assert _dense(out, "tokens", 8).tolist() == [
        [1, 2, 3, 4, 5, 6, 7, 8],
        [9, 10, 11, 12, 13, 14, 0, 0],
    ]
    assert _dense(out, "segment_ids", 8).tolist() == [[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 2, 2, 2, 2, 0, 0]]
    assert _dense(out, "positions", 8).tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 0, 1, 2, 3, 0, 0]]
    assert out.column(PROVENANCE_ROW).to_pylist() == [0, 2]
    assert out.column_names == ["tokens", "segment_ids", "positions", PROVENANCE_FILE, PROVENANCE_ROW]


def test_null_sequences_are_bad_records():
    table = pa.table(
        {
            "tokens": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
            PROVENANCE_FILE: ["a"] * 3,
            PROVENANCE_ROW: pa.array([0, 1, 2], pa.int64()),
        }
    )
    out = PackSequences(seq_len=4)(table)
    good, bad = split_errors(out)
    assert _dense(good, "tokens", 4).tolist() == [[1, 2, 3, 0]]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [1]
    assert bad.column(ERROR_COLUMN).to_pylist() == ["PackSequences: column 'tokens' is null"]


def _provenanced(col: pa.Array) -> pa.Table:
    n = len(col)
    return pa.table({"tokens": col, PROVENANCE_FILE: ["a"] * n, PROVENANCE_ROW: pa.array(range(n), pa.int64())})


def test_null_token_inside_a_sequence_is_a_bad_record():
    table = _provenanced(pa.array([[1, None, 3], [4, 5], [None]], pa.list_(pa.int64())))
    pack = transform_from_spec({"pack_sequences": {"seq_len": 4}})
    good, bad = split_errors(pack(table))
    assert _dense(good, "tokens", 4).tolist() == [[4, 5, 0, 0]]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 2]
    assert bad.column(ERROR_COLUMN).to_pylist() == [
        "PackSequences: column 'tokens' holds a null token id; fill or drop it before pack_sequences"
    ] * 2
    with pytest.raises(BadRecordError, match=r"row 0: PackSequences: column 'tokens' holds a null token id"):
        apply_transforms(table, [pack])


@pytest.mark.parametrize(
    "col",
    [
        pa.array([[2**32 + 5, 7], [70000, 2**31 - 1, -(2**31)], [2**40], [-(2**31) - 1]], pa.list_(pa.int64())),
        pa.array([[2**63 + 5, 7], [70000, 2**31 - 1, 0], [2**31], [2**32]], pa.list_(pa.uint64())),
    ],
    ids=["int64", "uint64"],
)
def test_token_ids_outside_int32_are_bad_records_not_wrapped(col):
    pack = transform_from_spec({"pack_sequences": {"seq_len": 4}})
    good, bad = split_errors(pack(_provenanced(col)))
    assert _dense(good, "tokens", 4).tolist() == [col[1].as_py() + [0]]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 2, 3]
    assert set(bad.column(ERROR_COLUMN).to_pylist()) == {
        ("PackSequences: column 'tokens' holds a token id outside int32 (the packed tokens' type); "
        "fix the ids, or map them into int32 before pack_sequences")
    }
    with pytest.raises(BadRecordError, match=r"row 0: PackSequences: column 'tokens' holds a token id outside int32"):
        apply_transforms(_provenanced(col), [pack])


def test_pack_spec_and_schema_errors():
    t = transform_from_spec({"pack_sequences": {"seq_len": 16, "strategy": "best_fit"}})
    assert t == PackSequences(seq_len=16, strategy="best_fit")
    with pytest.raises(SpecError, match=r"PackSequences: unknown strategy 'worst_fit'; allowed: first_fit, best_fit, concat"):
        PackSequences(strategy="worst_fit")
    with pytest.raises(SpecError, match=r"PackSequences: unknown overflow 'drop'; allowed: split, truncate"):
        PackSequences(overflow="drop")
    with pytest.raises(SpecError, match=r"seq_len must be a positive integer; got 0"):
        PackSequences(seq_len=0)
    schema = pa.schema([("text", pa.string()), ("ids", pa.list_(pa.string()))])
    with pytest.raises(SpecError, match=r"PackSequences: column 'tokens' not found; available: text, ids"):
        PackSequences().output_schema(schema)
    with pytest.raises(SpecError, match=r"column 'ids' has type list<item: string>; expected list<integer>"):
        PackSequences(column="ids").output_schema(schema)


@pytest.mark.parametrize("pad_id", [2**40, -(2**31) - 1, 2**31, 1 << 4000, 1.5, True, "0"])
def test_pad_id_outside_int32_is_refused_at_spec_time(pad_id):
    """The packed tokens are int32: a pad_id that is not an integer in int32's range
    is a SpecError naming pad_id and the range (or, not an integer, naming what it
    is), before any batch runs."""
    with pytest.raises(SpecError, match=r"PackSequences: (pad_id .* is not an integer in int32 "
                                        r"\[-2147483648, 2147483647\]|argument 'pad_id' must be an "
                                        r"integer; got)"):
        transform_from_spec({"pack_sequences": {"seq_len": 4, "pad_id": pad_id}})
    tbl = pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.int32()))})
    for edge in (-(2**31), 2**31 - 1):
        out = apply_transforms(tbl, [transform_from_spec({"pack_sequences": {"seq_len": 4, "pad_id": edge}})])
        assert out.column("tokens").to_pylist() == [[1, 2, edge, edge]]


def test_output_stats_efficiency(ray_cluster):
    import ray

    table, _ = _source([3, 5, 2, 4, 7, 1])
    t = PackSequences(seq_len=8, strategy="best_fit", overflow="truncate")
    ds = ray.data.from_arrow(table).map_batches(t, batch_format="pyarrow", batch_size=None)
    stats = t.output_stats(ds)
    assert stats["tokens"] == 22 and stats["rows"] * 8 == 22 + stats["pad_tokens"]
    assert stats["efficiency"] == pytest.approx(22 / (stats["rows"] * 8))
    assert stats["truncated_tokens"] == 0
