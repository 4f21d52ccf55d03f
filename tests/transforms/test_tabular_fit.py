"""FillNull, Standardize / MinMaxScale / Vocabulary fitted with Ray, HashBucket, Deduplicate."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest

from slicefeed.connectors import SpecError
from slicefeed.transforms import (
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    Deduplicate,
    FillNull,
    HashBucket,
    MinMaxScale,
    Standardize,
    Vocabulary,
    apply_transforms,
    transform_from_spec,
)
from slicefeed.transforms._hashing import hash64


def _table() -> pa.Table:
    n = 40
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, n)
    return pa.table(
        {
            "x": pa.array(x),
            "y": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int64()),
            "city": [["berlin", "paris", "rome", "oslo"][i % 4] if i % 5 else "paris" for i in range(n)],
            "tags": [["a", "b"] if i % 2 else ["b"] for i in range(n)],
            PROVENANCE_FILE: [f"part-{i // 20}.csv" for i in range(n)],
            PROVENANCE_ROW: pa.array([i % 20 for i in range(n)], pa.int64()),
        }
    )


@pytest.fixture
def ds(ray_cluster):
    import ray

    return ray.data.from_arrow(_table()).repartition(2)


@pytest.mark.slow
def test_standardize_fit_with_ray(ds):
    t = Standardize(["x", "y"])
    assert t.needs_fit and not t.is_fitted
    with pytest.raises(SpecError, match=r"Standardize: needs fit\(\) over the dataset"):
        apply_transforms(_table(), [t])
    with pytest.raises(SpecError, match=r"Standardize: needs fit\(ds\) \(or mean and std in the spec\)"):
        t(_table())
    f = t.fit(ds)
    tbl = _table()
    x = tbl.column("x").to_numpy()
    y = np.array([v for v in tbl.column("y").to_pylist() if v is not None], float)
    assert f.mean["x"] == pytest.approx(x.mean()) and f.std["x"] == pytest.approx(x.std())
    assert f.mean["y"] == pytest.approx(y.mean()) and f.std["y"] == pytest.approx(y.std())
    json.dumps(f.stats())
    assert f.stats() == {"mean": f.mean, "std": f.std}
    out = f(tbl)
    assert out.schema.field("x").type == pa.float32()
    np.testing.assert_allclose(out.column("x").to_numpy(), (x - x.mean()) / x.std(), rtol=1e-5)
    assert out.column("y").null_count == tbl.column("y").null_count
    # The fitted statistics round-trip through a spec (no refit needed).
    again = transform_from_spec(f.to_spec())
    assert again.is_fitted and again(tbl).equals(out)


@pytest.mark.slow
def test_min_max_scale_fit_with_ray(ds):
    f = MinMaxScale(["x"], dtype="float64").fit(ds)
    out = f(_table()).column("x").to_numpy()
    assert out.min() == pytest.approx(0.0) and out.max() == pytest.approx(1.0)
    assert set(f.stats()) == {"min", "max"}
    const = MinMaxScale(["x"], min={"x": 1.0}, max={"x": 1.0})
    assert const(pa.table({"x": [1.0, 1.0]})).column("x").to_pylist() == [0.0, 0.0]


@pytest.mark.slow
def test_vocabulary_fit_top_k_and_oov(ds):
    f = Vocabulary("city", top_k=2).fit(ds)
    # paris: 8 (every 4th from i%4==1) + 8 (i%5==0) minus overlap, deterministic tie-break by value.
    counts = {}
    for c in _table().column("city").to_pylist():
        counts[c] = counts.get(c, 0) + 1
    expect = sorted(counts, key=lambda c: (-counts[c], c))[:2]
    assert list(f.vocab) == expect
    out = f(pa.table({"city": ["paris", "nowhere", None, expect[1]]}))
    assert out.column("city").to_pylist() == [expect.index("paris") + 1 if "paris" in expect else 0, 0, None, 2]
    assert f.stats()["size"] == 2 and f.stats()["oov_id"] == 0
    tags = Vocabulary("tags", output="tag_ids").fit(ds)
    assert list(tags.vocab) == ["b", "a"]
    got = tags(_table().slice(0, 2))
    assert got.column("tag_ids").to_pylist() == [[1], [2, 1]]
    assert got.schema.field("tag_ids").type == pa.list_(pa.int32())


def test_vocabulary_errors():
    with pytest.raises(SpecError, match=r"Vocabulary: oov_id 2 collides with the vocabulary ids \[1, 3\)"):
        Vocabulary("c", vocab=["a", "b"], oov_id=2)
    with pytest.raises(SpecError, match=r"Vocabulary: column 'x' has type double; expected string or integer"):
        Vocabulary("x").output_schema(_table().schema)
    with pytest.raises(SpecError, match=r"Vocabulary: column 'town' not found; available: x, y, city, tags"):
        Vocabulary("town").output_schema(_table().schema)


def test_fill_null():
    out = FillNull({"y": -1})(_table())
    assert out.column("y").null_count == 0 and out.column("y").to_pylist()[0] == -1
    with pytest.raises(SpecError, match=r"FillNull: fill value 'n/a' for column 'y' cannot be cast to the column type int64"):
        FillNull({"y": "n/a"}).output_schema(_table().schema)
    with pytest.raises(SpecError, match=r"FillNull: column 'z' not found; available: x, y"):
        FillNull({"z": 0}).output_schema(_table().schema)


def test_fill_null_value_beyond_a_float_columns_range_is_a_spec_error():
    tbl = pa.table({"f": pa.array([1.0, None], pa.float32()), "h": pa.array([None, 2.0], pa.float16())})
    for col, v in (("f", 1e300), ("f", -3.5e38), ("h", 70000.0)):
        fill = transform_from_spec({"fill_null": {"values": {col: v}}})
        msg = rf"FillNull: fill value {re.escape(repr(v))} for column '{col}' overflows the column type"
        with pytest.raises(SpecError, match=msg):
            fill.output_schema(tbl.schema)
        with pytest.raises(SpecError, match=msg):
            apply_transforms(tbl, [fill])
    # inf stays inf; a finite value that rounds stays allowed.
    out = FillNull({"f": float("-inf"), "h": 0.1})(tbl)
    assert out.column("f").to_pylist() == [1.0, float("-inf")]
    assert out.column("h").to_pylist()[0] == pytest.approx(0.1, rel=1e-3)


def test_scaling_schema_errors():
    s = _table().schema
    with pytest.raises(SpecError, match=r"Standardize: column 'city' has type string; expected numeric"):
        Standardize(["city"]).output_schema(s)
    with pytest.raises(SpecError, match=r"MinMaxScale: column 'w' not found; available: x, y, city"):
        MinMaxScale(["w"]).output_schema(s)
    with pytest.raises(SpecError, match=r"Standardize: dtype must be float32 or float64; got 'bfloat16'"):
        Standardize(["x"], dtype="bfloat16")
    with pytest.raises(SpecError, match=r"Standardize: std has no value for column 'y'"):
        Standardize(["x", "y"], mean={"x": 0, "y": 0}, std={"x": 1})


def test_hash_bucket_stable_and_spread():
    t = HashBucket("city", 8, output="city_bucket")
    out = t(_table())
    b = out.column("city_bucket").to_pylist()
    cities = _table().column("city").to_pylist()
    assert all(0 <= v < 8 for v in b)
    assert len({(c, v) for c, v in zip(cities, b)}) == len(set(cities))  # a function of the value
    # Stable across processes and runs: pinned values (a change would re-bucket users' data).
    assert hash64(pa.array(["paris", ""])).tolist() == hash64(pa.array(["paris", ""])).tolist()
    many = HashBucket("s", 16)(pa.table({"s": [f"user-{i}" for i in range(4000)]})).column("s")
    counts = np.bincount(many.to_numpy(), minlength=16)
    assert counts.min() > 180 and counts.max() < 320
    ints = HashBucket("y", 5)(_table()).column("y")
    assert ints.null_count == _table().column("y").null_count
    assert HashBucket("s", 16, salt="x")(pa.table({"s": ["a", "b", "c", "d", "e"]})).column("s").to_pylist() != HashBucket("s", 16)(pa.table({"s": ["a", "b", "c", "d", "e"]})).column("s").to_pylist()
    with pytest.raises(SpecError, match=r"HashBucket: column 'tags' has type list<item: string>; expected string"):
        HashBucket("tags", 4).output_schema(_table().schema)
    with pytest.raises(SpecError, match=r"num_buckets must be an integer in \[1, 2\^31\); got 0"):
        HashBucket("city", 0)


def test_hash64_of_strings_matches_across_layouts():
    a = pa.array(["x", "yy", None, "zzz"])
    h = hash64(a)
    assert h[2] == 0
    sliced = hash64(pa.chunked_array([a.slice(1, 3)]))
    np.testing.assert_array_equal(sliced, h[1:])
    np.testing.assert_array_equal(hash64(a.cast(pa.large_string())), h)


def _dups() -> pa.Table:
    text = ["a", "b", "a", "c", "b", None, None, "a"]
    return pa.table(
        {
            "text": text,
            "n": [1, 2, 1, 3, 5, 0, 0, 9],
            PROVENANCE_FILE: ["f2", "f1", "f1", "f1", "f2", "f1", "f1", "f0"],
            PROVENANCE_ROW: pa.array([0, 0, 1, 2, 1, 3, 4, 0], pa.int64()),
        }
    )


def test_deduplicate_table():
    out = Deduplicate(["text"])(_dups())
    rows = sorted(zip(out.column("text").to_pylist(), out.column(PROVENANCE_FILE).to_pylist(), out.column(PROVENANCE_ROW).to_pylist()), key=str)
    # The survivor is the smallest (file, row) of each key, whatever the input order.
    assert rows == sorted([("a", "f0", 0), ("b", "f1", 0), ("c", "f1", 2), (None, "f1", 3)], key=str)
    both = Deduplicate(["text", "n"])(_dups())
    assert both.num_rows == 6  # (a,1),(b,2),(c,3),(b,5),(None,0),(a,9)
    assert Deduplicate()(_dups()).num_rows == 6  # all data columns


@pytest.mark.slow
def test_deduplicate_dataset_op(ray_cluster):
    import ray

    ds = ray.data.from_arrow(_dups()).repartition(2)
    t = Deduplicate(["text"])
    assert t.is_dataset_op
    out = t.dataset_op(ds).to_arrow_refs()
    tbl = pa.concat_tables(ray.get(out))
    got = sorted(zip(tbl.column("text").to_pylist(), tbl.column(PROVENANCE_FILE).to_pylist(), tbl.column(PROVENANCE_ROW).to_pylist()), key=str)
    assert got == sorted([("a", "f0", 0), ("b", "f1", 0), ("c", "f1", 2), (None, "f1", 3)], key=str)
    assert tbl.column_names == _dups().column_names
    # Fewer shuffle partitions: the same survivors in the same order.
    few = pa.concat_tables(ray.get(Deduplicate(["text"], partitions=3).dataset_op(ds).to_arrow_refs()))
    assert few.to_pylist() == tbl.to_pylist()
    with pytest.raises(SpecError, match=r"Deduplicate: column 'tags' has type list<item: string>; deduplicate on scalar"):
        Deduplicate(["tags"]).output_schema(_table().schema)
    with pytest.raises(SpecError, match=r"Deduplicate: column 'txt' not found; available: text, n"):
        Deduplicate(["txt"]).output_schema(_dups().schema)


def _blocks(ray, table: pa.Table, n: int):
    """A Ray dataset of ``table`` cut into ``n`` blocks."""
    k = -(-table.num_rows // n)
    return ray.data.from_arrow([table.slice(i, k) for i in range(0, table.num_rows, k)])


@pytest.mark.slow
def test_scaling_fit_ignores_nan_and_refuses_infinity(ray_cluster):
    import ray

    nan, inf = float("nan"), float("inf")
    ds = _blocks(ray, pa.table({"x": [1.0, 2.0, nan, 3.0]}), 2)
    # NaN is missing, like null: skipped by the fit, NaN in the output.
    s = transform_from_spec({"standardize": {"columns": ["x"], "dtype": "float64"}}).fit(ds)
    assert s.mean == {"x": 2.0} and s.std["x"] == pytest.approx((2 / 3) ** 0.5)
    out = s(pa.table({"x": [1.0, 2.0, 3.0, nan]})).column("x").to_pylist()
    assert out[:3] == pytest.approx([-(1.5**0.5), 0.0, 1.5**0.5]) and np.isnan(out[3])
    m = transform_from_spec({"min_max_scale": {"columns": ["x"]}}).fit(ds)
    assert m.min == {"x": 1.0} and m.max == {"x": 3.0}
    # An infinity has no mean, std, min or max to fit: a named error, never a 0.
    bad = _blocks(ray, pa.table({"ok": [1.0] * 4, "x": [1.0, 2.0, 3.0, inf], "y": [-inf, 1.0, 2.0, 3.0]}), 2)
    for name, label, col in (("standardize", "Standardize", "x"), ("min_max_scale", "MinMaxScale", "y")):
        t = transform_from_spec({name: {"columns": ["ok", col]}})
        with pytest.raises(SpecError, match=rf"{label}: column '{col}' holds 1 infinite value.*filter"):
            t.fit(bad)


@pytest.mark.slow
def test_standardize_constant_column_maps_to_zero(ray_cluster):
    import ray

    for value, n, nblocks in ((0.1, 1000, 7), (1e10 + 0.1, 999, 3)):
        t = pa.table({"x": [value] * n})
        f = Standardize(["x"], dtype="float64").fit(_blocks(ray, t, nblocks))
        assert f.stats() == {"mean": {"x": value}, "std": {"x": 0.0}}
        assert set(f(t).column("x").to_pylist()) == {0.0}


def test_scaling_of_integers_beyond_float_precision():
    ns = [1_700_000_000_000_000_000, 1_700_000_000_000_000_512, None]
    t = pa.table({"ts": pa.array(ns, pa.int64()), "u": pa.array([2**64 - 1, 0, None], pa.uint64())})
    s = transform_from_spec({"standardize": {"columns": ["ts"], "dtype": "float64",
                                             "mean": {"ts": 1.7e18}, "std": {"ts": 512.0}}})
    assert apply_transforms(t, [s]).column("ts").to_pylist() == [0.0, 1.0, None]
    m = transform_from_spec({"min_max_scale": {"columns": ["u"], "min": {"u": 0}, "max": {"u": 2.0**64}}})
    assert apply_transforms(t, [m]).column("u").to_pylist() == [1.0, 0.0, None]


def test_vocabulary_ids_must_fit_int32():
    with pytest.raises(SpecError, match=r"Vocabulary: first_id 2147483647 with 2 vocab values gives ids up to "
                                        r"2147483648, beyond int32"):
        transform_from_spec({"vocabulary": {"column": "c", "vocab": ["a", "b"], "first_id": 2**31 - 1,
                                            "oov_id": -(2**31)}})
    with pytest.raises(SpecError, match=r"Vocabulary: oov_id 2147483648 does not fit int32"):
        Vocabulary("c", vocab=["a"], oov_id=2**31)
    with pytest.raises(SpecError, match=r"Vocabulary: first_id -2147483649 does not fit int32"):
        Vocabulary("c", first_id=-(2**31) - 1)
    ok = Vocabulary("c", vocab=["a", "b"], first_id=2**31 - 2, oov_id=-(2**31))
    assert ok(pa.table({"c": ["a", "b", "z"]})).column("c").to_pylist() == [2**31 - 2, 2**31 - 1, -(2**31)]


def test_vocabulary_values_of_the_wrong_type_are_refused_before_any_batch():
    import yaml

    t = pa.table({"answer": ["yes", "no", None]})
    v = transform_from_spec(yaml.safe_load("vocabulary: {column: answer, vocab: [yes, no]}"))
    msg = (r"Vocabulary: vocab for column 'answer' \(string\) holds bool values \(first: True\); a string "
           r"column needs string values: in YAML, quote them \(vocab: \['yes', 'no', '02139'\]\)")
    with pytest.raises(SpecError, match=msg):
        v.output_schema(t.schema)
    with pytest.raises(SpecError, match=msg):
        apply_transforms(t, [v])
    z = pa.table({"zip": ["02139", "10001"]})
    with pytest.raises(SpecError, match=r"Vocabulary: vocab for column 'zip' \(string\) holds int values \(first: 2139\)"):
        transform_from_spec({"vocabulary": {"column": "zip", "vocab": ["10001", 2139]}}).output_schema(z.schema)
    n = pa.table({"n": pa.array([1, 2], pa.int32()), "tags": [["a"], ["b"]]})
    with pytest.raises(SpecError, match=r"Vocabulary: vocab for column 'n' \(int32\) holds str values \(first: '1'\); an integer column needs integer values"):
        Vocabulary("n", vocab=["1"]).output_schema(n.schema)
    with pytest.raises(SpecError, match=r"Vocabulary: vocab for column 'n' \(int32\) holds bool values \(first: True\)"):
        Vocabulary("n", vocab=[True]).output_schema(n.schema)
    with pytest.raises(SpecError, match=r"Vocabulary: vocab value 3000000000 does not fit column 'n' \(int32\)"):
        Vocabulary("n", vocab=[1, 3_000_000_000]).output_schema(n.schema)
    with pytest.raises(SpecError, match=r"Vocabulary: vocab for column 'tags' \(string\) holds int values \(first: 7\)"):
        Vocabulary("tags", vocab=[7]).output_schema(n.schema)
    assert Vocabulary("tags", vocab=["b"])(n).column("tags").to_pylist() == [[0], [1]]



def test_hash_of_dates_times_and_large_unsigned():
    import datetime

    d = pa.array([datetime.date(2020, 1, 1), None, datetime.date(2020, 1, 2), datetime.date(2020, 1, 1)])
    t = pa.table({"d": d, "t": pa.array([1, 2, None, 1], pa.time32("s")),
                  "u": pa.array([2**63 + 1, 5, None, 2**63 + 1], pa.uint64())})
    out = apply_transforms(t, [transform_from_spec({"hash_bucket": {"column": c, "num_buckets": 1000,
                                                                    "output": f"{c}_b"}}) for c in "dtu"])
    for c in "dtu":
        b = out.column(f"{c}_b").to_pylist()
        assert b[0] == b[3] and b[0] != b[1 if c != "t" else 2]
        h = hash64(t.column(c))
        np.testing.assert_array_equal(hash64(pa.chunked_array([t.column(c).chunk(0).slice(1), ])), h[1:])
    # Unsigned values below 2^63 keep the hash they had as signed integers.
    assert hash64(pa.array([5, 2**62], pa.uint64())).tolist() == hash64(pa.array([5, 2**62], pa.int64())).tolist()
    assert len(set(hash64(pa.array([1, 2**63 + 1, 2**64 - 1], pa.uint64())).tolist())) == 3
    with pytest.raises(SpecError, match=r"HashBucket: column 'i' has type month_day_nano_interval; expected"):
        HashBucket("i", 4).output_schema(pa.schema([("i", pa.month_day_nano_interval())]))


@pytest.mark.slow
def test_deduplicate_dataset_op_on_dates_and_large_unsigned(ray_cluster):
    import datetime

    import ray

    d1, d2 = datetime.date(2020, 1, 1), datetime.date(2021, 6, 30)
    t = pa.table({"d": [d1, d2, d1, None, None], "u": pa.array([2**63 + 1, 1, 2**63 + 1, 7, 7], pa.uint64()),
                  PROVENANCE_FILE: ["f"] * 5, PROVENANCE_ROW: pa.array(range(5), pa.int64())})
    dedup = Deduplicate(["d", "u"], partitions=2)
    out = pa.concat_tables(ray.get(dedup.dataset_op(_blocks(ray, t, 2)).to_arrow_refs()))
    assert sorted(out.column(PROVENANCE_ROW).to_pylist()) == [0, 1, 3]


@pytest.mark.slow
def test_deduplicate_key_columns_named_like_its_own(ray_cluster):
    import ray

    t = pa.table({"__sf_idx": [1, 1, 2], "idx_min": ["a", "a", "a"],
                  PROVENANCE_FILE: ["f"] * 3, PROVENANCE_ROW: pa.array([0, 1, 2], pa.int64())})
    spec = {"deduplicate": {"columns": ["__sf_idx", "idx_min"], "partitions": 2}}
    assert apply_transforms(t, [transform_from_spec(spec)]).column(PROVENANCE_ROW).to_pylist() == [0, 2]
    out = pa.concat_tables(ray.get(transform_from_spec(spec).dataset_op(_blocks(ray, t, 2)).to_arrow_refs()))
    assert sorted(out.column(PROVENANCE_ROW).to_pylist()) == [0, 2]
    assert out.column_names == t.column_names
    # The dataset operation's own hash column: refused by name before Ray runs.
    clash = t.append_column("__sf_key", pa.array([0, 0, 0]))
    with pytest.raises(SpecError, match=r"Deduplicate: the data has a column named '__sf_key'.*rename"):
        transform_from_spec(spec).output_schema(clash.schema)


def test_fill_null_uint64_beyond_int64():
    t = pa.table({"u": pa.array([1, None], pa.uint64())})
    f = transform_from_spec({"fill_null": {"values": {"u": 2**64 - 1}}})
    f.output_schema(t.schema)
    assert apply_transforms(t, [f]).column("u").to_pylist() == [1, 2**64 - 1]
    with pytest.raises(SpecError, match=r"FillNull: fill value 18446744073709551616 for column 'u' cannot be cast"):
        transform_from_spec({"fill_null": {"values": {"u": 2**64}}}).output_schema(t.schema)
    with pytest.raises(SpecError, match=r"FillNull: fill value -1 for column 'u' cannot be cast"):
        transform_from_spec({"fill_null": {"values": {"u": -1}}}).output_schema(t.schema)


@pytest.mark.slow
def test_deduplicate_dataset_op_gives_the_same_blocks_every_run(ray_cluster):
    """Ray's hash shuffle handed ``deduplicate``'s partitions over as its
    actors finished: the same input, even with the input's block order kept,
    came out in blocks of another order on each run. Rows now come out by key
    bucket in blocks of a fixed row count, whatever order the input's blocks
    are in."""
    import ray

    from slicefeed.connectors._compat import dataset_preserving_order

    rng = np.random.default_rng(0)
    blocks = [pa.table({"k": rng.integers(0, 1500, 500), PROVENANCE_FILE: [f"f{b}"] * 500,
                        PROVENANCE_ROW: pa.array(range(500), pa.int64())}) for b in range(8)]
    runs = []
    for order in (blocks, blocks, blocks[::-1]):
        ds = dataset_preserving_order(ray.data.from_arrow(order))
        out = ray.get(Deduplicate(["k"], partitions=16).dataset_op(ds).to_arrow_refs())
        runs.append([t.to_pylist() for t in out])
    assert runs[0] == runs[1] == runs[2]
    assert sum(map(len, runs[0])) == len(np.unique(np.concatenate([b.column("k").to_numpy() for b in blocks])))


@pytest.mark.parametrize("partitions", [0, 257, -1])
def test_deduplicate_partitions_outside_its_range_is_refused(partitions):
    with pytest.raises(SpecError, match=r"Deduplicate: partitions must be an integer in \[1, 256\]"):
        transform_from_spec({"deduplicate": {"partitions": partitions}})


def test_deduplicate_partitions_is_in_the_fingerprint_only_when_not_the_default():
    """The partition count decides the order rows come out in, not which survive."""
    default = transform_from_spec({"deduplicate": {"columns": ["x"]}}).fingerprint_spec()
    assert transform_from_spec({"deduplicate": {"columns": ["x"], "partitions": 200}}).fingerprint_spec() == default
    assert transform_from_spec({"deduplicate": {"columns": ["x"], "partitions": 8}}).fingerprint_spec() != default


def test_deduplicate_treats_zero_and_negative_zero_as_one_key():
    t = pa.table({"x": [0.0, -0.0, 1.0, -0.0], PROVENANCE_FILE: ["f"] * 4,
                  PROVENANCE_ROW: pa.array([1, 0, 2, 3], pa.int64())})
    out = apply_transforms(t, [transform_from_spec({"deduplicate": {"columns": ["x"]}})])
    # The survivor is the smallest (file, row), with its own value (-0.0 here).
    assert out.column(PROVENANCE_ROW).to_pylist() == [0, 2]
    assert np.signbit(out.column("x").to_numpy()).tolist() == [True, False]
    assert hash64(pa.array([0.0])).tolist() == hash64(pa.array([-0.0])).tolist()


def _order_sensitive_table() -> pa.Table:
    """Values over eight decades, and a zero of each sign as the minimum of
    column ``z``: merged in another order, rounded float sums and a first-seen
    zero differ in their last bits."""
    rng = np.random.default_rng(0)
    n = 600
    x = rng.normal(1e3, 1.0, n) * rng.choice([1.0, 1e-3, 1e4], n)
    z = np.abs(rng.normal(0.0, 1.0, n))
    z[::50] = 0.0
    z[25::50] = -0.0
    return pa.table({"x": x, "z": z})


def _permutations(k: int):
    yield list(range(k))
    yield list(range(k))[::-1]
    yield [*range(1, k, 2), *range(0, k, 2)]


def test_column_summary_is_the_same_bits_in_any_merge_order():
    from slicefeed.transforms._moments import ColumnSummary

    t = _order_sensitive_table()
    for col in ("x", "z"):
        agg = ColumnSummary(col, alias_name="s")
        parts = [agg.aggregate_block(t.slice(i, 100)) for i in range(0, t.num_rows, 100)]
        got = set()
        for perm in _permutations(len(parts)):
            acc = parts[perm[0]]
            for i in perm[1:]:
                acc = agg.combine(acc, parts[i])
            f = agg.finalize(acc)
            got.add(tuple(v.hex() if isinstance(v, float) else v for v in f.values()))
        assert len(got) == 1, (col, got)
    # The same values cut into other blocks give the same summary too.
    agg = ColumnSummary("x", alias_name="s")
    whole = agg.finalize(agg.aggregate_block(t))
    parts = [agg.aggregate_block(t.slice(i, 7)) for i in range(0, t.num_rows, 7)]
    acc = parts[0]
    for p in parts[1:]:
        acc = agg.combine(acc, p)
    assert agg.finalize(acc)["mean"].hex() == whole["mean"].hex()
    assert agg.finalize(acc)["std"].hex() == whole["std"].hex()
    x = t.column("x").to_numpy()
    assert whole["mean"] == pytest.approx(x.mean(), rel=1e-15)
    assert whole["std"] == pytest.approx(x.std(), rel=1e-13)


@pytest.mark.slow
def test_fit_is_bit_identical_whichever_block_arrives_first(ray_cluster):
    import ray

    t = _order_sensitive_table()
    blocks = [t.slice(i, 100) for i in range(0, t.num_rows, 100)]
    fits = [Standardize(["x", "z"], dtype="float64").fit(ray.data.from_arrow(bs))
            for bs in (blocks, blocks[::-1])]
    a, b = ({k: {c: v.hex() for c, v in d.items()} for k, d in f.stats().items()} for f in fits)
    assert a == b
    x = t.column("x").to_numpy()
    assert fits[0].mean["x"] == pytest.approx(x.mean(), rel=1e-15)
