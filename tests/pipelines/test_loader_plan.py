"""Property tests of the loader's pure planning (no Ray, no JAX, no I/O)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slicefeed.pipelines._loader import _plan

files_st = st.lists(st.integers(0, 40), min_size=1, max_size=6).map(
    lambda sizes: [(f"f{i}", n) for i, n in enumerate(sizes)]
)


@given(n=st.integers(0, 10_000), hosts=st.integers(1, 64))
def test_host_shares_partition_rows_balanced(n, hosts):
    shares = _plan.host_shares(n, hosts)
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shares))
    sizes = [b - a for a, b in shares]
    assert max(sizes) - min(sizes) <= 1


@given(sizes=st.lists(st.integers(0, 500), min_size=1, max_size=8), lb=st.integers(1, 64))
def test_steps_every_host_can_take(sizes, lb):
    drop = _plan.steps_for(sizes, lb, "drop")
    pad = _plan.steps_for(sizes, lb, "pad")
    assert all(drop * lb <= s for s in sizes)  # drop: every step is full on every host
    assert all(pad * lb >= s for s in sizes)  # pad: every row fits
    assert (pad - 1) * lb < max(sizes) or pad == 0
    for s in sizes:
        read = _plan.delivered_rows(s, drop, lb, "drop")
        assert read == drop * lb  # only rows of full agreed steps are read


# Files as (path, num_rows, row-group sizes); () stands for row groups not recorded.
rg_files_st = st.lists(
    st.one_of(st.lists(st.integers(0, 15), min_size=0, max_size=4).map(tuple)),
    min_size=1, max_size=6,
).map(lambda gs: [(f"f{i}", sum(g), g) for i, g in enumerate(gs)])


@settings(max_examples=200, deadline=None)
@given(
    files=rg_files_st,
    hosts=st.integers(1, 4),
    window=st.integers(1, 30),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
)
def test_windows_and_locate_cover_each_row_once(files, hosts, window, seed, epoch, shuffle):
    total = sum(n for _, n, _ in files)
    units = _plan.read_units(files)
    assert sum(hi - lo for _, lo, hi in units) == total
    order = _plan.epoch_unit_order(len(units), seed, epoch, shuffle)
    assert sorted(order.tolist()) == list(range(len(units)))
    seen = []
    for h, (start, stop) in enumerate(_plan.host_shares(total, hosts)):
        share = _plan.pieces(units, order, start, stop)
        assert sum(hi - lo for _, lo, hi in share) == stop - start
        # every piece lies inside one unit
        assert all(any(p == q and a <= lo and hi <= b for q, a, b in units) for p, lo, hi in share)
        ws = _plan.windows(share, window)
        assert all(0 < sum(hi - lo for _, lo, hi in w) <= window for w in ws)
        flat = [(p, r) for p, lo, hi in share for r in range(lo, hi)]
        assert [(p, r) for w in ws for p, lo, hi in w for r in range(lo, hi)] == flat
        # a window holds whole pieces, or one chunk of a piece larger than a window
        whole = set(share)
        for w in ws:
            assert all(piece in whole for piece in w) or (
                len(w) == 1 and any(p == w[0][0] and lo <= w[0][1] and w[0][2] <= hi
                                    and hi - lo > window for p, lo, hi in share))
        runs = _plan.read_runs(share, window)
        assert [k for a, b in runs for k in range(a, b)] == list(range(len(ws)))
        for a, b in runs:  # a run of several windows continues one piece
            assert all(ws[k][-1][2] == ws[k + 1][0][1] and ws[k][0][0] == ws[k + 1][0][0]
                       for k in range(a, b - 1))
        located = []
        for row in range(stop - start):
            k, pos = _plan.find_window(ws, row)
            assert 0 <= pos < sum(hi - lo for _, lo, hi in ws[k])
            rng_of = (lambda k, h=h: _plan.window_rng(seed, epoch, h, k)) if shuffle else None
            p, r, _ = _plan.locate(share, window, row, rng_of)
            located.append((p, r))
        if not shuffle:
            assert located == flat
        assert sorted(located) == sorted(flat)  # each row of the share exactly once
        seen += located
    assert len(seen) == len(set(seen)) == total


@given(
    share=files_st.map(lambda fs: [(p, 0, n) for p, n in fs if n]),
    skip=st.integers(0, 100),
)
def test_skip_pieces_drops_exactly_a_prefix(share, skip):
    flat = [(p, r) for p, lo, hi in share for r in range(lo, hi)]
    rest = _plan.skip_pieces(share, skip)
    assert [(p, r) for p, lo, hi in rest for r in range(lo, hi)] == flat[skip:]


@given(rows=st.integers(0, 200), seed=st.integers(0, 5))
def test_window_permutation_is_a_permutation(rows, seed):
    perm = _plan.window_permutation([seed, 0, 0, 0], rows)
    assert np.array_equal(np.sort(perm), np.arange(rows))


# --------------------------------------------------------------------------- elastic resume


def _rows(spans) -> list[tuple[str, int]]:
    """The (file, row) pairs of ``spans`` in delivery order."""
    out = []
    for s in spans:
        flat = [(p, r) for p, lo, hi in s.pieces for r in range(lo, hi)]
        out += [flat[i] for i in _plan.span_order(s)]
    return out


@settings(max_examples=60, deadline=None)  # timing varies on a loaded machine
@given(
    files=rg_files_st,
    hosts=st.integers(1, 4),
    lb=st.integers(1, 6),
    windows_of=st.integers(1, 4),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
    shuffle=st.booleans(),
    remainder=st.sampled_from(["drop", "pad"]),
)
def test_host_spans_deliver_what_the_unresumed_plan_delivers(
    files, hosts, lb, windows_of, seed, epoch, shuffle, remainder
):
    """The spans of a host's epoch list exactly the rows, in the order, that the
    plan without resume reads (windows, window permutation, agreed-step limit),
    followed by the rows that plan drops."""
    units = _plan.read_units(files)
    total = sum(n for _, n, _ in files)
    window = lb * windows_of
    shares = [b - a for a, b in _plan.host_shares(total, hosts)]
    steps = _plan.steps_for(shares, lb, remainder)
    order = _plan.epoch_unit_order(len(units), seed, epoch, shuffle)
    for h, (start, stop) in enumerate(_plan.host_shares(total, hosts)):
        limit = _plan.delivered_rows(shares[h], steps, lb, remainder)
        spans = _plan.host_spans(
            units, process_count=hosts, process_index=h, seed=seed, epoch=epoch,
            shuffle=shuffle, window_rows=window, limit=limit,
        )
        share = _plan.pieces(units, order, start, start + limit)
        rng_of = (lambda k, h=h: _plan.window_rng(seed, epoch, h, k)) if shuffle else None
        expected = [_plan.locate(share, window, row, rng_of)[:2] for row in range(limit)]
        got = _rows(spans)
        assert got[:limit] == expected
        dropped = _plan.pieces(units, order, start + limit, stop)
        assert got[limit:] == [(p, r) for p, lo, hi in dropped for r in range(lo, hi)]
        assert all(
            _plan.locate_span(spans, i)[:2] == got[i] for i in range(len(got))
        )


stage_st = st.tuples(st.integers(1, 4), st.integers(1, 6), st.floats(0, 1))


@settings(max_examples=100, deadline=None)
@given(
    files=rg_files_st,
    chain=st.lists(stage_st, min_size=1, max_size=3),
    final=st.tuples(st.integers(1, 4), st.integers(1, 6)),
    windows_of=st.integers(1, 4),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
    shuffle=st.booleans(),
    remainder=st.sampled_from(["drop", "pad"]),
)
def test_elastic_resume_delivers_every_row_once(
    files, chain, final, windows_of, seed, epoch, shuffle, remainder
):
    """An epoch taken partly on H hosts, then H', H'' ... hosts (each stage with
    its own local batch, stopped after a random number of steps), then finished
    on the final layout: no row twice; with ``"pad"`` every row exactly once,
    with ``"drop"`` fewer than one batch per final host is dropped; every host
    of every stage takes the same number of steps."""
    units = _plan.read_units(files)
    total = sum(n for _, n, _ in files)
    all_rows = [(p, r) for p, lo, hi in units for r in range(lo, hi)]
    delivered = []
    stages: list[_plan.Stage] = []
    for hosts, lb, frac in chain:
        window = lb * windows_of
        if not stages:
            shares = [b - a for a, b in _plan.host_shares(total, hosts)]
            steps = _plan.steps_for(shares, lb, remainder)
            lists = [
                _plan.host_spans(
                    units, process_count=hosts, process_index=h, seed=seed, epoch=epoch,
                    shuffle=shuffle, window_rows=window,
                    limit=_plan.delivered_rows(shares[h], steps, lb, remainder),
                )
                for h in range(hosts)
            ]
        else:
            lists = _plan.stage_spans(
                units, seed=seed, epoch=epoch, shuffle=shuffle, remainder=remainder,
                stages=stages, process_count=hosts,
            )
        sizes = [_plan.spans_rows(s) for s in lists]
        assert max(sizes) - min(sizes) <= 1 or not stages  # balanced re-split
        steps = _plan.steps_for(sizes, lb, remainder)
        taken = int(frac * steps)
        for spans, n in zip(lists, sizes):
            delivered += _rows(spans)[: min(taken * lb, _plan.delivered_rows(n, steps, lb, remainder))]
        stages.append(_plan.Stage(hosts, lb, window, taken))

    hosts, lb = final
    parts = [
        _plan.elastic_epoch(
            units, seed=seed, epoch=epoch, shuffle=shuffle, remainder=remainder,
            stages=stages, process_count=hosts, process_index=h, local_batch_size=lb,
        )
        for h in range(hosts)
    ]
    assert len({p.steps for p in parts}) == 1  # equal steps on every new host
    steps = parts[0].steps
    for p in parts:
        n = _plan.spans_rows(p.spans)
        if remainder == "drop":
            assert n == steps * lb and p.share - n <= lb
        else:
            assert (steps - 1) * lb < max(q.share for q in parts) and n == p.share <= steps * lb
        delivered += _rows(p.spans)
    assert len(delivered) == len(set(delivered)), "a row was delivered twice"
    assert set(delivered) <= set(all_rows)
    if remainder == "pad":
        assert sorted(delivered) == sorted(all_rows)
    else:
        assert total - len(delivered) <= hosts * lb


@settings(max_examples=50, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.integers(0, 30), st.booleans(), st.integers(0, 3)), min_size=1, max_size=5
    ).map(
        lambda xs: [
            _plan.Span(((f"f{i}", 0, n),), (s, 0, 0, i) if shuf else None, 0, n)
            for i, (n, shuf, s) in enumerate(xs)
        ]
    ),
    a=st.integers(0, 100),
    b=st.integers(0, 100),
)
def test_cut_spans_is_a_slice_of_the_delivery_stream(spans, a, b):
    rows = _rows(spans)
    cut = _plan.cut_spans(spans, a, b)
    assert _rows(cut) == rows[a:b]
    assert all(s.lo == 0 for s in cut if s.rng is None)  # unshuffled spans stay trimmed


def test_nothing_to_load_tells_no_rows_from_a_host_without_a_full_batch():
    """A host with no rows while another has some is "no full batch fits", not
    "0 rows on all hosts"; both construction and an unknown-count epoch say it."""
    shares = [0, 10]
    assert _plan.steps_for(shares, 4, "drop") == 0
    msg = _plan.nothing_to_load(2, 4, "drop", any_rows=sum(shares) > 0, smallest_share=min(shares))
    assert "no full batch fits: the smallest host share has 0 rows, fewer than the local batch (4)" in msg
    msg = _plan.nothing_to_load(2, 4, "drop", any_rows=True, epoch=3)
    assert msg.startswith("JaxLoader: epoch 3 of the source: with remainder='drop' no full batch")
    for remainder in ("drop", "pad"):
        msg = _plan.nothing_to_load(2, 4, remainder, any_rows=False)
        assert "has no rows (0 rows on all 2 host(s))" in msg
