"""JaxLoader never changes data silently: dtype rules, bfloat16 bits, pad values,
dropped rows never converted, sticky errors, strict state, freed when dropped,
any Ray Dataset block format; and Ray's own iter_jax_batches cases replayed."""

from __future__ import annotations

import gc
import hashlib
import io
import os
import re
import threading
import time
import weakref

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import SpecError


@pytest.fixture(scope="module")
def env(ray_cluster, jax_cpu):
    return jax_cpu


def _commit(root: str, tables: list[pa.Table], *, row_group_size: int = 4) -> str:
    """Writes ``tables`` as part-*.parquet files committed as version 1 under ``root``."""
    from slicefeed.connectors import Manifest, ManifestFile
    from tests.pipelines._data import commit_manifest

    os.makedirs(root, exist_ok=True)
    files = []
    for i, t in enumerate(tables):
        sink = io.BytesIO()
        pq.write_table(t, sink, row_group_size=row_group_size)
        data = sink.getvalue()
        name = f"part-{i:05d}.parquet"
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        md = pq.read_metadata(io.BytesIO(data))
        groups = tuple(md.row_group(k).num_rows for k in range(md.num_row_groups))
        files.append(ManifestFile(name, t.num_rows, len(data),
                                  hashlib.sha256(data).hexdigest(), groups, "testdata"))
    commit_manifest(root, Manifest(files=tuple(files), schema=tables[0].schema))
    return root


# --------------------------------------------------------------------------- 64-bit columns


def test_64bit_columns_refused_without_x64(env):
    import jax
    import ray

    from slicefeed.pipelines import JaxLoader

    assert not jax.config.jax_enable_x64
    ids = np.arange(16, dtype=np.int64)
    ids[5] = 4294967301  # would arrive as 5 after a silent int32 wrap
    ds = ray.data.from_arrow(pa.table({"id": ids, "w": np.ones(16)}))
    with pytest.raises(SpecError, match=r"column 'id' is int64.*jax_enable_x64.*"
                       r"dtypes=\{'id': 'int32'\}.*enable x64"):
        JaxLoader(ds, global_batch_size=8, columns=["id"])
    with pytest.raises(SpecError, match=r"column 'w' is double.*dtypes=\{'w'"):
        JaxLoader(ds, global_batch_size=8, columns=["w"])
    with pytest.raises(SpecError, match=r"column 'w' is cast to float64 by dtypes=.*x64"):
        JaxLoader(ds, global_batch_size=8, columns=["w"], dtypes={"w": "float64"})


def test_dtypes_cast_is_range_checked_with_file_and_row(env, local_dir):
    from slicefeed.pipelines import JaxLoader

    ids = np.arange(24, dtype=np.int64)
    ids[21] = 4294967301
    t = pa.table({"id": ids})
    uri = _commit(os.path.join(local_dir, "wide"), [t.slice(0, 16), t.slice(16)])
    loader = JaxLoader(uri, global_batch_size=8, dtypes={"id": "int32"}, prefetch=0,
                       remainder="pad")
    got = [np.asarray(next(loader)["id"]) for _ in range(2)]
    assert np.concatenate(got).tolist() == list(range(16))  # rows in range pass
    with pytest.raises(SpecError, match=r"column 'id', file 'part-00001.parquet' row 5: "
                       r"value 4294967301 does not fit dtypes\['id'\] = int32"):
        next(loader)

    # float64 -> float32: rounding within range is fine, beyond range is an error.
    vals = np.array([1.1, -2.5e-3, 3.4e38, np.inf, np.nan, 0, 1, 2], dtype=np.float64)
    uri = _commit(os.path.join(local_dir, "f64"), [pa.table({"v": vals})])
    b = next(JaxLoader(uri, global_batch_size=8, dtypes={"v": "float32"}))
    np.testing.assert_array_equal(np.asarray(b["v"]), vals.astype(np.float32))
    vals[6] = 1e39
    uri = _commit(os.path.join(local_dir, "f64-big"), [pa.table({"v": vals})])
    with pytest.raises(SpecError, match=r"column 'v', file 'part-00000.parquet' row 6: "
                       r"value 1e\+39 does not fit"):
        next(JaxLoader(uri, global_batch_size=8, dtypes={"v": "float32"}))


def test_null_inside_a_row_names_the_file_and_row(env, local_dir):
    """A null element inside a fixed-size row of a committed dataset is refused
    naming the column, the file and the row that holds it."""
    from slicefeed.pipelines import JaxLoader

    values = pa.array([v if v != 13 else None for v in range(24)], pa.int32())
    t = pa.table({"x": pa.FixedSizeListArray.from_arrays(values, 2)})  # 12 rows of 2
    uri = _commit(os.path.join(local_dir, "null-inside"), [t.slice(0, 4), t.slice(4)])
    with pytest.raises(SpecError, match=r"column 'x', file 'part-00001.parquet' row 2: a null "
                       r"value \(1 in this batch\)"):
        list(JaxLoader(uri, global_batch_size=8, remainder="pad"))


def test_casts_to_bool_and_64_bit_integers_are_range_checked(env, local_dir):
    """Only 0 and 1 become booleans; a float of 2**63 does not fit int64 although
    float(2**63 - 1) == 2**63; a dtype the loader cannot deliver is refused up front."""
    import jax

    from slicefeed.pipelines import JaxLoader

    def first(name, values, dtype, **kw):
        uri = _commit(os.path.join(local_dir, name), [pa.table({"v": values})])
        return np.asarray(next(JaxLoader(uri, global_batch_size=8, dtypes={"v": dtype},
                                         prefetch=0, **kw))["v"])

    ok = np.array([0, 1, 1, 0, 0, 1, 0, 1], dtype=np.int32)
    assert first("bool-ok", ok, "bool").tolist() == ok.astype(bool).tolist()
    for name, bad, value in [("bool-int", np.array([0, 1, 2, 0, 0, 1, 0, 1], np.int32), "2"),
                             ("bool-nan", np.array([0, 1, np.nan, 0, 0, 1, 0, 1], np.float32),
                              "nan")]:
        with pytest.raises(SpecError, match=rf"column 'v', file 'part-00000.parquet' row 2: "
                           rf"value {value} does not fit dtypes\['v'\] = bool"):
            first(name, bad, "bool")
    with jax.enable_x64(True):  # this thread only: prefetch=0 converts here
        below = np.array([1, 2.0**63 - 1024, -2.0**63, 0, 0, 0, 0, 0])
        assert first("i64-ok", below, "int64").tolist() == below.astype(np.int64).tolist()
        for name, big, dtype in [("i64", 2.0**63, "int64"), ("u64", 2.0**64, "uint64")]:
            with pytest.raises(SpecError, match=rf"column 'v', file 'part-00000.parquet' row 1: "
                               rf"value .* does not fit dtypes\['v'\] = {dtype}"):
                first(name, np.array([1, big, 2, 3, 4, 5, 6, 7]), dtype)
    for dtype in ["complex64", "longdouble", "U3", "datetime64[s]"]:
        with pytest.raises(SpecError, match=r"dtypes\['v'\] = .* is not an output dtype"):
            first("bool-ok", ok, dtype)


def test_range_error_names_row_with_shuffle(env, local_dir):
    """Shuffled windows: the error still names the file row that holds the value."""
    from slicefeed.pipelines import JaxLoader

    ids = np.arange(40, dtype=np.int64)
    ids[29] = -(2**40)
    uri = _commit(os.path.join(local_dir, "shuf"), [pa.table({"id": ids})])
    with pytest.raises(SpecError, match=r"file 'part-00000.parquet' row 29: value -1099511627776"):
        for _ in JaxLoader(uri, global_batch_size=8, dtypes={"id": "int16"}, shuffle=True,
                           shuffle_buffer_rows=16, seed=3):
            pass


# --------------------------------------------------------------------------- bfloat16


def test_dtypes_byte_order_is_native_and_none_is_refused(env, local_dir):
    """A big-endian dtypes= target ('>i4') names the same values as its native
    twin and is delivered as that (JAX holds native order only; it failed at
    the first batch with JAX's bare TypeError); None is no dtype (NumPy reads
    it as float64) and is refused at construction naming the column."""
    from slicefeed.pipelines import JaxLoader

    vals = np.arange(16, dtype=np.int32)
    uri = _commit(os.path.join(local_dir, "byteorder"), [pa.table({"x": vals})])
    for dtype, want in ((">i4", np.int32), ("<f4", np.float32), (np.dtype(">f4"), np.float32),
                        (">u2", np.uint16)):
        (b0, b1) = JaxLoader(uri, global_batch_size=8, dtypes={"x": dtype}, prefetch=0)
        got = np.concatenate([np.asarray(b0["x"]), np.asarray(b1["x"])])
        assert got.dtype == np.dtype(want), dtype
        np.testing.assert_array_equal(got, vals.astype(want))
    with pytest.raises(SpecError, match=r"dtypes\['x'\] = None is not a dtype.*leave 'x' out "
                       r"of dtypes="):
        JaxLoader(uri, global_batch_size=8, dtypes={"x": None})


def test_seed_outside_its_range_is_refused_at_construction(env, local_dir):
    """A negative seed passed the option check and failed at the first shuffled
    next() with NumPy's bare "expected non-negative integer"; every source
    takes seeds in [0, 2**32) (the Ray-source shuffle maps each of them to its
    own stream), so one beyond is refused too, naming seed= and the range."""
    from slicefeed.pipelines import JaxLoader

    uri = _commit(os.path.join(local_dir, "seed"), [pa.table({"x": np.arange(16, dtype=np.int32)})])
    for seed in (-1, 2**32, -(2**70)):
        with pytest.raises(SpecError, match=r"seed must be an integer in \[0, 2\*\*32\), got "):
            JaxLoader(uri, global_batch_size=8, shuffle=True, seed=seed)
    for seed in (0, 2**32 - 1):
        got = np.concatenate([np.asarray(b["x"]) for b in
                              JaxLoader(uri, global_batch_size=8, shuffle=True, seed=seed)])
        assert sorted(got.tolist()) == list(range(16))


def test_bfloat16_storage_arrives_as_bfloat16_bits(env, local_dir):
    import jax.numpy as jnp
    import ml_dtypes
    import ray

    from slicefeed.pipelines import JaxLoader
    from slicefeed.transforms._dtypes import bfloat16_field, to_bfloat16_bits

    rng = np.random.default_rng(0)
    f = rng.normal(size=(16, 3)).astype(np.float32)
    bits = to_bfloat16_bits(f)
    schema = pa.schema([
        bfloat16_field("s"),
        bfloat16_field("v", pa.list_(pa.uint16(), 3)),
        pa.field("f", pa.float32()),
    ])
    t = pa.Table.from_arrays(
        [
            pa.array(bits[:, 0]),
            pa.FixedSizeListArray.from_arrays(pa.array(bits.ravel()), 3),
            pa.array(f[:, 0]),
        ],
        schema=schema,
    )
    uri = _commit(os.path.join(local_dir, "bf16"), [t])
    for src in (ray.data.from_arrow(t), uri):
        loader = JaxLoader(src, global_batch_size=16, dtypes={"f": "bfloat16"})
        b = next(loader)
        assert b["s"].dtype == b["v"].dtype == b["f"].dtype == jnp.bfloat16
        # a view of the stored bits, not a value cast of the uint16 numbers
        np.testing.assert_array_equal(np.asarray(b["s"]).view(np.uint16), bits[:, 0])
        np.testing.assert_array_equal(np.asarray(b["v"]).view(np.uint16), bits)
        # a value cast rounds exactly like jnp.asarray(x, jnp.bfloat16)
        want = np.asarray(jnp.asarray(f[:, 0], jnp.bfloat16))
        np.testing.assert_array_equal(
            np.asarray(b["f"]).view(np.uint16), want.view(np.uint16)
        )
        assert np.asarray(b["s"]).dtype == np.dtype(ml_dtypes.bfloat16)
        loader.close()


#: Reads that put a committed dataset's shards into one window (the default
#: unshuffled ~32 MB window, a shuffle's default buffer), windows of a few row
#: groups that straddle shards, windows of one row group, and Ray read tasks.
_SHARD_READS = [{}, {"shuffle": True, "seed": 0}, {"shuffle": True, "seed": 1, "shuffle_buffer_rows": 8},
                {"shuffle": True, "seed": 2, "shuffle_buffer_rows": 4}, {"reader": "ray"}]


@pytest.mark.parametrize("read", _SHARD_READS, ids=["one-window", "shuffled", "buffer-8",
                                                    "buffer-4", "ray-reader"])
def test_shard_that_differs_from_the_manifest_is_named_in_every_window(env, local_dir, read):
    """Every shard of a committed dataset has the manifest's schema; one that was
    changed after the commit is refused naming the file, the column and both
    types (or bfloat16 markers) whatever the window: when two shards shared a
    window Arrow's concatenation kept the first one's field metadata, so plain
    uint16 integers arrived as bfloat16 numbers (16256 as 1.0), or it raised
    its bare ArrowInvalid "Schema at index 1 was different"."""
    from slicefeed.connectors import MissingColumnError
    from slicefeed.pipelines import JaxLoader
    from slicefeed.transforms._dtypes import bfloat16_field

    ids = np.arange(32, dtype=np.int32)
    bits = np.full(32, 16256, dtype=np.uint16)  # 1.0 as bfloat16 bits
    marked = pa.schema([pa.field("id", pa.int32()), bfloat16_field("v")])
    plain = pa.schema([pa.field("id", pa.int32()), pa.field("v", pa.uint16())])

    def tables(schema_a, schema_b, b_ids=ids[12:]):
        return [pa.Table.from_arrays([pa.array(ids[:12]), pa.array(bits[:12])], schema=schema_a),
                pa.Table.from_arrays([pa.array(b_ids), pa.array(bits[12:])], schema=schema_b)]

    cases = [
        (SpecError, (r"column 'v' is plain uint16 in shard '[^']*part-00001\.parquet', but "
                    r"bfloat16 bits \(slicefeed.dtype metadata\) in the dataset's manifest"),
         tables(marked, plain)),
        (SpecError, (r"column 'v' is bfloat16 bits \(slicefeed.dtype metadata\) in shard "
                    r"'[^']*part-00001\.parquet', but plain uint16 in the dataset's manifest"),
         tables(plain, marked)),
        (SpecError, (r"column 'id' is int64 in shard '[^']*part-00001\.parquet', but int32 in "
                    r"the dataset's manifest"),
         tables(plain, pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.uint16())]),
                ids[12:].astype(np.int64))),
        (MissingColumnError, r"column 'v' is missing from shard '[^']*part-00001\.parquet'",
         [tables(plain, plain)[0], pa.table({"id": ids[12:]})]),
    ]
    for k, (error, match, tabs) in enumerate(cases):
        uri = _commit(os.path.join(local_dir, f"changed-{k}"), tabs)
        with pytest.raises(error, match=match + r".*modified or replaced after the commit.*"
                                               r"rewrite the dataset with --overwrite") as e:
            list(JaxLoader(uri, global_batch_size=8, **read))
        assert len(str(e.value)) < 1000
    # Only the declared nullability differs, every value is valid: the values are
    # the manifest's, so the shards load alike in every window (as nullable).
    for k, first in enumerate((False, True)):
        fields = [pa.field("id", pa.int32(), nullable=first), pa.field("v", pa.uint16())]
        other = [pa.field("id", pa.int32(), nullable=not first), pa.field("v", pa.uint16())]
        uri = _commit(os.path.join(local_dir, f"nullable-{k}"),
                      tables(pa.schema(fields), pa.schema(other)))
        got = [np.asarray(b["id"]) for b in JaxLoader(uri, global_batch_size=8, **read)]
        assert sorted(np.concatenate(got).tolist()) == list(range(32))


# --------------------------------------------------------------------------- padding


def test_pad_values_apply_to_every_column_kind(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    n = 10
    t = pa.table({
        "label": pa.array(np.arange(n, dtype=np.int32)),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(2 * n, np.float32)), 2),
        "toks": pa.array([[1] * (i % 3) for i in range(n)], pa.list_(pa.int32())),
    })
    loader = JaxLoader(
        ray.data.from_arrow(t), global_batch_size=8, remainder="pad",
        pad_lengths={"toks": 2}, pad_values={"label": -100, "x": -1.5, "toks": 7},
    )
    first, last = list(loader)
    mask = np.asarray(last["mask"])
    assert mask.tolist() == [True] * 2 + [False] * 6
    assert np.asarray(last["label"])[~mask].tolist() == [-100] * 6
    assert (np.asarray(last["x"])[~mask] == -1.5).all()
    assert (np.asarray(last["toks"])[~mask] == 7).all()
    # within-row padding of a variable-length list uses the same value
    assert np.asarray(last["toks"])[:2].tolist() == [[1, 1], [7, 7]]  # rows 8 (2 toks), 9 (0)
    assert np.asarray(first["toks"])[:3].tolist() == [[7, 7], [1, 7], [1, 1]]
    with pytest.raises(SpecError, match=r"pad_values\['label'\] = 300 does not fit.*int8"):
        JaxLoader(ray.data.from_arrow(t), global_batch_size=8, remainder="pad",
                  pad_lengths={"toks": 2}, dtypes={"label": "int8"}, pad_values={"label": 300})


# --------------------------------------------------------------------------- drop


@pytest.mark.parametrize("kind", ["dataset", "unknown-count", "committed"])
def test_drop_never_converts_the_dropped_rows(env, local_dir, kind):
    """A null in the dropped tail would fail conversion: it must never be converted."""
    import ray

    from slicefeed.pipelines import JaxLoader

    vals = pa.array(list(range(18)) + [None, 19], pa.int32())
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40, dtype=np.float32)), 2)
    t = pa.table({"v": vals, "x": x})
    if kind == "committed":
        src = _commit(os.path.join(local_dir, "drop"), [t])
    else:
        src = ray.data.from_arrow(t)
        if kind == "unknown-count":
            src = src.map_batches(lambda b: b, batch_format="pyarrow")
    loader = JaxLoader(src, global_batch_size=8, remainder="drop")
    batches = list(loader)
    assert len(batches) == 2
    assert np.concatenate([np.asarray(b["v"]) for b in batches]).tolist() == list(range(16))
    s = loader.stats()
    assert s["dropped_rows"] == 4 and s["rows"] == 16
    assert s["host_copies"] == 0  # nothing padded or copied for the dropped batch


# --------------------------------------------------------------------------- lifetime


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("slicefeed-")]


def _big_ds(rows=512):
    import ray

    return ray.data.from_arrow(pa.table({
        "a": pa.array(np.arange(rows, dtype=np.int32)),
        "z": pa.FixedSizeListArray.from_arrays(
            pa.array(np.zeros(rows * 3, np.float32)), 3),
    })).repartition(8)


def test_dropped_loader_is_freed(env):
    from slicefeed.pipelines import JaxLoader

    ds = _big_ds()
    before = len(_loader_threads())
    refs = []
    for _ in range(5):
        loader = JaxLoader(ds, global_batch_size=8, prefetch=2)
        refs.append(weakref.ref(loader))
        for _b in loader:
            break
        del loader, _b
    gc.collect()
    deadline = time.monotonic() + 10
    while len(_loader_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [r() for r in refs] == [None] * 5, "a dropped loader is still alive"
    assert len(_loader_threads()) <= before, [t.name for t in _loader_threads()]


@pytest.mark.slow
def test_prefetch_holds_at_most_n_device_batches(env):
    import jax

    from slicefeed.pipelines import JaxLoader

    def live():  # global batches of column z: shape (8, 3)
        return sum(1 for a in jax.live_arrays() if a.shape == (8, 3))

    for n in (1, 3):
        gc.collect()
        base = live()
        loader = JaxLoader(_big_ds(), global_batch_size=8, prefetch=n, columns=["z"])
        held = next(loader)
        time.sleep(3)  # let the producer fill everything it may
        gc.collect()
        # n prefetched + the one the test holds
        assert live() - base <= n + 1, (n, live() - base)
        del held
        loader.close()
        del loader
        gc.collect()


def test_error_reraised_on_every_later_next(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    vals = [[1, 2]] * 20 + [None] + [[3]] * 11
    ds = ray.data.from_arrow(pa.table({"toks": pa.array(vals, pa.list_(pa.int32()))}))
    for prefetch in (0, 2):
        loader = JaxLoader(ds, global_batch_size=8, pad_lengths={"toks": 2}, prefetch=prefetch)
        with pytest.raises(SpecError, match="a null value") as first:
            for _ in loader:
                pass
        for _ in range(2):
            with pytest.raises(SpecError) as again:
                next(loader)
            assert again.value is first.value


# --------------------------------------------------------------------------- state, empty


def test_state_checks_every_plan_key(env, local_dir):
    from slicefeed.pipelines import JaxLoader

    uri = _commit(os.path.join(local_dir, "st"), [pa.table({"a": np.arange(32, dtype=np.int32),
                                                            "b": np.arange(32, dtype=np.int32)})])
    sd = JaxLoader(uri, global_batch_size=8).state_dict()
    with pytest.raises(SpecError, match=r"source is missing from the state.*"
                       r"global_batch_size is missing"):
        JaxLoader(uri, global_batch_size=8, state={**sd, "plan": {}})
    with pytest.raises(SpecError, match=r"saved with columns=\['a', 'b'\], this loader has "
                       r"columns=\['a'\]"):
        JaxLoader(uri, global_batch_size=8, columns=["a"], state=sd)
    plan = {**sd["plan"], "extra": 1}
    with pytest.raises(SpecError, match=r"unknown plan key 'extra'"):
        JaxLoader(uri, global_batch_size=8, state={**sd, "plan": plan})


def test_column_written_twice_is_named(env, local_dir):
    """A schema naming a column twice failed with pyarrow's bare KeyError
    "Column x does not exist in schema" (the column exists, twice)."""
    from slicefeed.pipelines import JaxLoader

    x = pa.array(np.arange(8, dtype=np.int32))
    uri = _commit(os.path.join(local_dir, "dup"), [pa.Table.from_arrays([x, x, x], ["x", "x", "y"])])
    for kwargs in ({}, {"columns": ["x", "y"]}):
        with pytest.raises(SpecError, match=r"column 'x' appears 2 times in the dataset's schema"):
            JaxLoader(uri, global_batch_size=8, **kwargs)
    for kwargs in ({"columns": ["y"]}, {"exclude": ["x"]}):
        (batch,) = JaxLoader(uri, global_batch_size=8, **kwargs)
        assert list(batch) == ["y"]


def test_state_and_arguments_are_quoted_cut_in_messages(env, local_dir):
    """A state may be arbitrary user data (read back from any checkpoint), and
    a bad argument any object: messages quoted either whole, 100 kB and more."""
    from slicefeed.pipelines import JaxLoader

    uri = _commit(os.path.join(local_dir, "st"), [pa.table({"a": np.arange(32, dtype=np.int32)})])
    sd = JaxLoader(uri, global_batch_size=8).state_dict()
    big = "x" * 100_000
    states = [{**sd, "plan": {**sd["plan"], "source": big}}, {**sd, "plan": big},
              {**sd, "seed": big}, {**sd, "plan": {**sd["plan"], **{big + str(i): 1 for i in range(50)}}},
              {**sd, "step": 10 ** 5000}]
    arguments = [{"pad_values": {"a": big}}, {"remainder": big}, {"seed": big}, {"reader": big},
                 {"columns": [big]}, {"num_epochs": big}, {"global_batch_size": 10 ** 5000}]
    for kwargs in [{"state": s} for s in states] + arguments:
        with pytest.raises(SpecError) as e:
            JaxLoader(uri, **{"global_batch_size": 8, **kwargs})
        assert 50 < len(str(e.value)) < 1500, (list(kwargs), len(str(e.value)))


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_empty_source_error_says_empty(env, remainder):
    import ray

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(pa.table({"a": pa.array([], pa.int32())}))
    with pytest.raises(SpecError) as e:
        JaxLoader(ds, global_batch_size=8, remainder=remainder)
    assert "no rows" in str(e.value)
    assert "no full batch" not in str(e.value)


def test_dataset_committed_empty_says_no_rows(env, local_dir):
    """A dataset committed with no rows (its manifest has no schema) is "no
    rows", not "no columns selected", whatever the columns asked for."""
    import ray

    from slicefeed.connectors import write_parquet
    from slicefeed.pipelines import JaxLoader

    uri = os.path.join(local_dir, "committed-empty")
    write_parquet(ray.data.from_arrow(pa.table({"x": pa.array([], pa.int32())})), uri)
    for kw in ({}, {"columns": ["x"]}):
        with pytest.raises(SpecError, match="the source has no rows"):
            JaxLoader(uri, global_batch_size=8, **kw)


@pytest.mark.parametrize("num_epochs", [1, None])
@pytest.mark.slow
def test_unknown_count_source_without_a_step_is_an_error_not_endless(env, num_epochs):
    """A source whose row count is unknown (a DataIterator, a filtered Dataset)
    and that gives no step raises what a source of known counts raises at
    construction, instead of 0 batches (or, with num_epochs=None, empty epochs
    forever)."""
    import ray

    from slicefeed.pipelines import JaxLoader

    t = pa.table({"x": pa.array(np.arange(10, dtype=np.int32))})
    cases = [
        (lambda: ray.data.from_arrow(t.slice(0, 0)).streaming_split(1)[0], "pad", "no rows"),
        (lambda: ray.data.from_arrow(t).filter(expr="x > 100"), "pad", "no rows"),
        (lambda: ray.data.from_arrow(t.slice(0, 2)).streaming_split(1)[0], "drop",
         "no full batch fits"),
    ]
    for source, remainder, says in cases:
        out: dict = {}

        def first(source=source, remainder=remainder, out=out):
            try:
                out["batch"] = next(JaxLoader(source(), global_batch_size=8,
                                              remainder=remainder, num_epochs=num_epochs), None)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                out["error"] = e

        th = threading.Thread(target=first, daemon=True)
        th.start()
        th.join(120)
        assert not th.is_alive(), "next() neither returned nor raised"
        assert isinstance(out.get("error"), SpecError), out
        assert says in str(out["error"]), out


# --------------------------------------------------------------------------- block formats


def test_pandas_blocks_are_a_source(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    df = pd.DataFrame({"one": np.arange(16), "two": np.arange(16) + 0.5})
    sources = {
        "from_pandas": ray.data.from_pandas([df.iloc[:7], df.iloc[7:]]),
        "map_batches-pandas": ray.data.from_items(
            [{"one": i, "two": i + 0.5} for i in range(16)]
        ).map_batches(lambda d: d, batch_format="pandas"),
    }
    for name, ds in sources.items():
        loader = JaxLoader(ds, global_batch_size=8, dtypes={"one": "int32", "two": "float32"})
        got = list(loader)
        one = np.concatenate([np.asarray(b["one"]) for b in got])
        two = np.concatenate([np.asarray(b["two"]) for b in got])
        assert sorted(one.tolist()) == list(range(16)), name
        np.testing.assert_array_equal(np.sort(two), np.arange(16) + 0.5)


@pytest.mark.parametrize("kind", ["iterator", "dataset"])
@pytest.mark.slow
def test_blocks_of_another_type_are_refused_not_cast(env, kind):
    """Ray's blocks of one dataset need not share a schema: a block whose column
    has another type than the one the conversion was planned for is an error
    naming the column and both types, never a cast (1.7 -> 1, float64 -> float32);
    a tensor block and a fixed_size_list block of one shape are alike."""
    import ray

    from slicefeed.pipelines import JaxLoader

    def source(blocks):
        ds = ray.data.from_arrow(blocks)
        if kind == "iterator":
            return ds.streaming_split(1)[0]
        # Ray's schema after a map is its first block's (from_arrow's unifies them).
        return ds.map_batches(lambda t: t, batch_format="pyarrow", batch_size=None)

    def refused(match, blocks, **kwargs):
        with pytest.raises(SpecError, match=match):
            list(JaxLoader(source(blocks), global_batch_size=8, **kwargs))
        # A split left mid-epoch keeps its coordinator actor running, and taking
        # CPU, until the iterator is freed; the error's traceback holds it in a
        # reference cycle that only the garbage collector breaks.
        gc.collect()

    def fsl(size):
        return pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8 * size, dtype=np.int32)),
                                                 size)

    cases = [
        [pa.table({"x": pa.array(np.arange(8, dtype=np.int32))}),
         pa.table({"x": pa.array(np.arange(8, dtype=np.float32) + 0.5)})],
        [pa.table({"x": fsl(2)}), pa.table({"x": fsl(3)})],
    ]
    for blocks in cases:
        types = "|".join(re.escape(str(b.schema.field("x").type)) for b in blocks)
        refused(rf"column 'x' is ({types}) in the batch at row \d+ .*, but ({types}) in the "
                r"schema the loader planned from: the source's blocks differ in type", blocks)
        if blocks is not cases[0]:
            continue
        # Shuffled, the blocks meet in the loader's buffer: refused there (Ray's
        # own buffer promoted them, int32 and float32 to double, unchecked).
        refused(r"the source's blocks differ in type", blocks, shuffle=True, seed=0,
                shuffle_buffer_rows=8, dtypes={"x": "float32"})
    # The same uint16 column, bfloat16 bits in one block and integers in the
    # other: whichever block came first decided for both, and the other's
    # values arrived changed (1 as a bfloat16 denormal, 1.0 as 16256).
    from slicefeed.transforms._dtypes import bfloat16_field, to_bfloat16_bits

    bits = pa.table([pa.array(to_bfloat16_bits(np.arange(8, dtype=np.float32)))],
                    schema=pa.schema([bfloat16_field("x")]))
    plain = pa.table({"x": pa.array(np.arange(8, dtype=np.uint16))})
    # Each order once, one of them shuffled (there Arrow kept the first block's
    # marker for both): each loader starts a Ray execution.
    for blocks, shuffle in (([bits, plain], False), ([plain, bits], True)):
        refused(r"column 'x' holds (bfloat16 bits|plain uint16) .*the source's blocks differ, "
                r"and reading one as the other would change every value", blocks,
                shuffle=shuffle, seed=0)
    values = np.arange(64, dtype=np.float32).reshape(16, 2, 2)
    nested = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(values[8:].ravel()), 2), 2)
    blocks = [pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(values[:8])}),
              pa.table({"x": nested})]
    got = np.concatenate([np.asarray(b["x"]) for b in JaxLoader(source(blocks), global_batch_size=8)])
    np.testing.assert_array_equal(got, values)
    # Shuffled, they must share one table, and Arrow has no cast between them.
    refused(r"a shuffle has to put them in one table", blocks, shuffle=True, seed=0,
            shuffle_buffer_rows=8)


# --------------------------------------------------------------------------- Ray's own cases


def _one_device_mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]), ("data",))


def test_ray_iter_jax_batches_cases_replayed(env):
    """Ray Data's tests for iter_jax_batches (python/ray/data/tests/, Ray 2.5x), replayed
    through JaxLoader. Ray runs them on one device: a 1-device mesh does the same here.
    Ray's collate_fn case has no JaxLoader counterpart (conversion is the loader's job)."""
    import ray

    from slicefeed.pipelines import JaxLoader

    mesh = _one_device_mesh()
    # test_iter_jax_batches: 8 rows from pandas blocks, batch 3, padding -1.
    df1 = pd.DataFrame({"one": [1, 2, 3], "two": [1.0, 2.0, 3.0], "label": [1.0, 2.0, 3.0]})
    df2 = pd.DataFrame({"one": [4, 5, 6], "two": [4.0, 5.0, 6.0], "label": [4.0, 5.0, 6.0]})
    df3 = pd.DataFrame({"one": [7, 8], "two": [7.0, 8.0], "label": [7.0, 8.0]})
    df = pd.concat([df1, df2, df3])
    ds = ray.data.from_pandas([df1, df2, df3])
    cols = ("one", "two", "label")
    loader = JaxLoader(
        ds, global_batch_size=3, mesh=mesh, remainder="pad",
        dtypes={"one": "int32", "two": "float32", "label": "float32"},
        pad_values={c: -1 for c in cols},
    )
    it = [np.stack([np.asarray(b[c], np.float64) for c in cols], axis=1) for b in loader]
    combined = np.concatenate(it)
    assert len(combined) == 9
    expected = np.concatenate([df.values, [[-1.0, -1.0, -1.0]]])
    np.testing.assert_array_equal(np.sort(combined, axis=0), np.sort(expected, axis=0))

    # test_iter_jax_batches_with_dtypes
    items = ray.data.from_items([{"one": i, "two": i + 0.5} for i in range(10)])
    for dtypes in ({"one": "float32", "two": "float32"}, {"one": "int32", "two": "float16"}):
        loader = JaxLoader(items, global_batch_size=2, mesh=mesh, dtypes=dtypes)
        for b in loader:
            assert {k: str(v.dtype) for k, v in b.items()} == dtypes
    loader = JaxLoader(items, global_batch_size=4, mesh=mesh, remainder="pad",
                       dtypes={"one": "float16", "two": "float16"},
                       pad_values={"one": -1, "two": -1})
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        assert b["one"].dtype == b["two"].dtype == np.float16

    # test_iter_jax_batches_with_dict_padding
    loader = JaxLoader(items, global_batch_size=4, mesh=mesh, remainder="pad",
                       dtypes={"one": "int32", "two": "float32"},
                       pad_values={"one": -1, "two": -0.5})
    batches = list(loader)
    assert len(batches) == 3
    one = np.concatenate([np.asarray(b["one"]) for b in batches])
    two = np.concatenate([np.asarray(b["two"]) for b in batches])
    np.testing.assert_array_equal(np.sort(one), np.sort(np.r_[np.arange(10), [-1, -1]]))
    np.testing.assert_array_equal(np.sort(two), np.sort(np.r_[np.arange(10) + 0.5, [-0.5] * 2]))

    # test_iter_jax_batches_batch_size_divisibility_fail: 8 local devices here
    with pytest.raises(ValueError, match=r"global_batch_size \(3\).*number of devices \(8\)"):
        JaxLoader(ray.data.range(10), global_batch_size=3, dtypes={"id": "int32"})


def test_same_batches_and_sharding_as_ray_iter_jax_batches(env):
    """On all 8 devices: JaxLoader's default mesh and Ray's iter_jax_batches give
    equal shardings (no recompile when mixing them) and equal padded values."""
    import ray

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_items([{"one": i, "two": i + 0.5} for i in range(20)]).repartition(1)
    ours = list(JaxLoader(ds, global_batch_size=8, remainder="pad",
                          dtypes={"one": "int32", "two": "float32"},
                          pad_values={"one": -1, "two": -0.5}))
    theirs = list(ds.iter_jax_batches(batch_size=8, paddings={"one": -1, "two": -0.5},
                                      dtypes={"one": np.int32, "two": np.float32}))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        for k in ("one", "two"):
            assert a[k].sharding == b[k].sharding
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
