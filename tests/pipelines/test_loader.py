"""JaxLoader on 8 CPU devices in one process: shapes, shardings, dtypes, masks,
no recompiles, Arrow-native columns, errors, determinism and resume."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import SpecError
from tests.pipelines._conformance import assert_equal_output_after_checkpoint, digests
from tests.pipelines._data import make_table
from tests.pipelines.conftest import run_worker, wait_all


@pytest.fixture(scope="module")
def env(ray_cluster, jax_cpu):
    return jax_cpu


def check_values(batch):
    """x and y of every real row agree with its id (see _data.make_table); padding is 0."""
    keep = np.asarray(batch["mask"]) if "mask" in batch else slice(None)
    ids = np.asarray(batch["id"]).astype(np.int64)
    x = np.asarray(batch["x"], dtype=np.float32)
    y = np.asarray(batch["y"]).reshape(len(ids), 6)
    np.testing.assert_array_equal(x[keep], (ids[keep][:, None] * 10 + np.arange(4)) * 1.0)
    np.testing.assert_array_equal(y[keep], ids[keep][:, None] + np.arange(6))
    if "mask" in batch:
        assert not ids[~keep].any() and not x[~keep].any() and not y[~keep].any()


def _ids(batch, mask_key="mask"):
    ids = np.asarray(batch["id"])
    if mask_key in batch:
        return ids[np.asarray(batch[mask_key])]
    return ids


def test_shapes_shardings_dtypes_and_mask(env):
    import jax
    import ml_dtypes
    import ray
    from jax.sharding import NamedSharding, PartitionSpec

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(make_table(0, 100))
    loader = JaxLoader(
        ds, global_batch_size=16, remainder="pad", dtypes={"id": "int32", "x": "bfloat16"}
    )
    assert loader.steps_per_epoch == 7  # known before the first batch: ceil(100 / 16)
    batches = list(loader)
    assert len(batches) == 7
    expected = {
        "id": ((16,), np.dtype("int32")),
        "x": ((16, 4), np.dtype(ml_dtypes.bfloat16)),
        "y": ((16, 3, 2), np.dtype("int32")),
        "mask": ((16,), np.dtype("bool")),
    }
    for b in batches:
        assert {k: (v.shape, v.dtype) for k, v in b.items()} == expected
        for v in b.values():
            assert isinstance(v.sharding, NamedSharding)
            assert v.sharding.spec == PartitionSpec("data")
            assert v.sharding.mesh.devices.size == jax.device_count() == 8
            assert len(v.addressable_shards) == 8
            assert v.addressable_shards[0].data.shape[0] == 2
    # Mask: True exactly on real rows; the last batch has 4 real rows + 12 padded zeros.
    last = batches[-1]
    mask = np.asarray(last["mask"])
    assert mask.tolist() == [True] * 4 + [False] * 12
    assert np.asarray(last["id"])[4:].tolist() == [0] * 12
    assert np.asarray(last["x"], dtype=np.float32)[4:].sum() == 0
    ids = np.concatenate([_ids(b) for b in batches])
    assert sorted(ids.tolist()) == list(range(100))
    # values survived conversion (x[i] = id * 10 + j; bfloat16 exact for these small ints)
    b0 = batches[0]
    np.testing.assert_array_equal(
        np.asarray(b0["x"], dtype=np.float32),
        np.asarray(b0["id"])[:, None] * 10 + np.arange(4)[None, :],
    )
    np.testing.assert_array_equal(
        np.asarray(b0["y"]),
        (np.asarray(b0["id"])[:, None] + np.arange(6)[None, :]).reshape(16, 3, 2),
    )
    s = loader.stats()
    assert s["rows"] == 100 and s["batches"] == 7 and s["padded_rows"] == 12
    assert s["bytes"] == 100 * (4 + 4 * 2 + 6 * 4)
    assert s["time_to_first_batch_s"] is not None and s["input_stall_s_total"] >= 0


def test_user_mesh_and_partition_spec(env):
    import jax
    import ray
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from slicefeed.pipelines import JaxLoader

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "model"))
    spec = PartitionSpec(("data", "fsdp"))
    ds = ray.data.from_arrow(make_table(0, 64))
    loader = JaxLoader(ds, global_batch_size=16, mesh=mesh, partition_spec=spec)
    b = next(loader)
    assert b["x"].sharding == NamedSharding(mesh, spec)
    assert b["y"].sharding == NamedSharding(mesh, spec)
    # 4 batch shards of 4 rows, each replicated over "model" (2 copies).
    shards = b["id"].addressable_shards
    assert len(shards) == 8 and {s.data.shape for s in shards} == {(4,)}
    starts = sorted(s.index[0].start for s in shards)
    assert starts == [0, 0, 4, 4, 8, 8, 12, 12]
    assert np.asarray(b["id"]).tolist() == list(range(16))

    # no reshard / recompile when a jitted step pins the same sharding
    @jax.jit
    def f(batch):
        return jax.lax.with_sharding_constraint(batch["x"] * 2, NamedSharding(mesh, spec))

    assert f(b).sharding == NamedSharding(mesh, spec)
    loader.close()


def test_batch_size_error_suggests_valid_size(env):
    import ray
    from jax.sharding import Mesh, PartitionSpec

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(make_table(0, 64))
    with pytest.raises(SpecError, match=r"global_batch_size \(12\).*number of devices \(8\).*"
                       r"try global_batch_size=16"):
        JaxLoader(ds, global_batch_size=12)
    import jax

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    with pytest.raises(SpecError, match=r"batch axes \('data',\).*try global_batch_size=6"):
        JaxLoader(ds, global_batch_size=5, mesh=mesh, partition_spec=PartitionSpec("data"))


def test_column_errors(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    t = make_table(0, 32).append_column("text", pa.array(["a"] * 32)).append_column(
        "toks", pa.array([[1, 2, 3][: i % 4] for i in range(32)], pa.list_(pa.int32()))
    )
    ds = ray.data.from_arrow(t)
    with pytest.raises(SpecError, match=r"column 'nope' given in columns= not found.*"
                       r"available: id, x, y, text, toks"):
        JaxLoader(ds, global_batch_size=8, columns=["id", "nope"])
    with pytest.raises(SpecError, match=r"column 'nope' given in dtypes= not found"):
        JaxLoader(ds, global_batch_size=8, exclude=["text", "toks"], dtypes={"nope": "int32"})
    with pytest.raises(SpecError, match=r"column 'text' is a string.*exclude=\['text'\]"):
        JaxLoader(ds, global_batch_size=8, pad_lengths={"toks": 4})
    with pytest.raises(SpecError, match=r"column 'toks' is a variable-length list.*"
                       r"pad_lengths=\{'toks': L\}"):
        JaxLoader(ds, global_batch_size=8, exclude=["text"])
    # With the declared length it loads: padded with 0 / truncated.
    loader = JaxLoader(ds, global_batch_size=8, columns=["id", "toks"], pad_lengths={"toks": 2})
    b = next(loader)
    assert b["toks"].shape == (8, 2)
    assert np.asarray(b["toks"])[:4].tolist() == [[0, 0], [1, 0], [1, 2], [1, 2]]
    loader.close()


def test_pyarrow_fixed_size_list_2048(env, local_dir):
    """A fixed_size_list<int32>[2048] Parquet file written by pyarrow: Ray's plain
    iter_jax_batches fails on it (object arrays); JaxLoader yields dense int32."""
    import ray

    from slicefeed.pipelines import JaxLoader

    n, width = 48, 2048
    tokens = (np.arange(n * width, dtype=np.int64) % 50_000).astype(np.int32)
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), width),
        }
    )
    path = os.path.join(local_dir, "tokens.parquet")
    pq.write_table(table, path, row_group_size=16)
    assert pq.read_schema(path).field("tokens").type == pa.list_(pa.int32(), width)

    # materialize once: both loaders below read the same Ray blocks
    # Ray's plain path fails on this column (NumPy object arrays). The Dataset is
    # built from the file with pyarrow: Ray's read_parquet yields the same Arrow
    # block, but its ListFiles task can take minutes on an overloaded machine.
    ds = ray.data.from_arrow(pq.read_table(path))
    with pytest.raises(Exception, match="(?i)dtype object|object"):
        next(iter(ds.iter_jax_batches(batch_size=16)))

    loader = JaxLoader(ds, global_batch_size=16, dtypes={"id": "int32"})
    batches = list(loader)
    assert len(batches) == 3
    got = np.concatenate([np.asarray(b["tokens"]) for b in batches])
    assert got.dtype == np.int32 and got.shape == (n, width)
    np.testing.assert_array_equal(got, tokens.reshape(n, width))

    # The same pyarrow-written file as a committed dataset: read from disk by the
    # loader's own Ray read tasks (row groups of 16 rows).
    import hashlib

    from slicefeed.connectors import Manifest, ManifestFile
    from tests.pipelines._data import commit_manifest

    data = Path(path).read_bytes()
    m = Manifest(
        files=(ManifestFile("tokens.parquet", n, len(data), hashlib.sha256(data).hexdigest()),),
        schema=table.schema,
    )
    commit_manifest(local_dir, m)
    with JaxLoader(local_dir, global_batch_size=16, columns=["tokens"]) as loader:
        got = np.concatenate([np.asarray(b["tokens"]) for b in loader])
    np.testing.assert_array_equal(got, tokens.reshape(n, width))


def test_copy_count_fixed_size_list(env):
    """0 host copies for a fixed_size_list batch inside one Arrow buffer, and on the
    CPU backend the device buffer is the Arrow buffer when 64-byte aligned."""
    import io

    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from slicefeed.pipelines._loader._convert import convert_table, plan_columns

    sink = io.BytesIO()  # read back through Parquet: Arrow-allocated (64-byte aligned)
    pq.write_table(make_table(0, 64, width=16), sink)  # row = 64 bytes of float32
    t = pq.read_table(io.BytesIO(sink.getvalue()))
    specs = plan_columns(t.schema, columns=["x"])
    counter = [0]
    part = t.slice(16, 16)  # a batch inside one block, as Ray's batcher slices it
    x = convert_table(specs, part, counter)["x"]
    assert counter == [0]
    values = t.column("x").chunk(0).values
    buf = np.frombuffer(values.buffers()[1], dtype=np.float32)
    assert np.shares_memory(x, buf) and x.shape == (16, 16)
    assert x.ctypes.data % 64 == 0
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    arr = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), x, x.shape
    )
    ptrs = sorted(s.data.unsafe_buffer_pointer() for s in arr.addressable_shards)
    assert ptrs[0] == x.ctypes.data  # zero-copy: the device shards alias the Arrow buffer
    # A dtypes cast is exactly one copy; several chunks one concatenation.
    counter = [0]
    specs16 = plan_columns(t.schema, columns=["x"], dtypes={"x": "bfloat16"})
    convert_table(specs16, part, counter)
    assert counter == [1]
    counter = [0]
    convert_table(specs, pa.concat_tables([t.slice(0, 8), t.slice(8, 8)]), counter)
    assert counter == [1]


def test_jit_no_recompile_over_epochs_and_padding(env, committed):
    import jax
    import jax.numpy as jnp

    from slicefeed.pipelines import JaxLoader

    uri, n = committed
    traces = []

    @jax.jit
    def step(batch):
        traces.append(1)  # runs only while tracing
        w = batch["mask"].astype(jnp.float32)
        return jnp.sum(batch["x"].astype(jnp.float32).sum(axis=1) * w), jnp.sum(w)

    loader = JaxLoader(uri, global_batch_size=16, remainder="pad", num_epochs=2, prefetch=3)
    total_rows = 0.0
    for b in loader:
        _, rows = step(b)
        total_rows += float(rows)
    assert total_rows == 2 * n
    assert len(traces) == 1 and step._cache_size() == 1


def test_drop_counts_and_unknown_counts(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(make_table(0, 100))
    loader = JaxLoader(ds, global_batch_size=16)
    assert loader.steps_per_epoch == 6
    batches = list(loader)
    assert len(batches) == 6 and "mask" not in batches[0]
    assert loader.stats()["dropped_rows"] == 4 and loader.stats()["rows"] == 96

    # A Dataset Ray cannot count without executing: same batches, counted on the fly.
    unknown = ds.map_batches(lambda b: b, batch_format="pyarrow")
    assert unknown._meta_count() is None
    lu = JaxLoader(unknown, global_batch_size=16, remainder="pad", prefetch=0)
    assert lu.steps_per_epoch is None
    got = list(lu)
    assert len(got) == 7
    assert sorted(np.concatenate([_ids(b) for b in got]).tolist()) == list(range(100))
    ld = JaxLoader(unknown, global_batch_size=16)
    assert len(list(ld)) == 6 and ld.stats()["dropped_rows"] == 4


def test_prefetch_error_surfaces_with_traceback(env):
    import ray

    from slicefeed.pipelines import JaxLoader

    vals = [[1, 2]] * 20 + [None] + [[3]] * 11
    ds = ray.data.from_arrow(pa.table({"toks": pa.array(vals, pa.list_(pa.int32()))}))
    loader = JaxLoader(ds, global_batch_size=8, pad_lengths={"toks": 2}, prefetch=2)
    with pytest.raises(SpecError, match=r"column 'toks', row 20 of this host's epoch 0 .*: a "
                       r"null value \(1 in this batch\)") as ei:
        for _ in loader:
            pass
    tb = "".join(traceback.format_tb(ei.value.__traceback__))
    assert "_check_nulls" in tb  # the producer thread's frames are kept
    assert loader.stats()["batches"] == 2


def test_null_inside_a_list_is_refused_in_its_own_batch(env):
    """A null element inside a variable-length list is refused in the batch that
    holds it: the batches before it (slices of the same block, sharing its
    values) are delivered."""
    import ray

    from slicefeed.pipelines import JaxLoader

    vals = [[1, 2]] * 20 + [[None, 4]] + [[3]] * 11
    ds = ray.data.from_arrow(pa.table({"toks": pa.array(vals, pa.list_(pa.int32()))}))
    loader = JaxLoader(ds, global_batch_size=8, pad_lengths={"toks": 2}, prefetch=0)
    got = []
    with pytest.raises(SpecError, match=r"column 'toks', row 20 of this host's epoch 0 .*: a "
                       r"null value"):
        for b in loader:
            got.append(np.asarray(b["toks"]))
    assert len(got) == 2 and (np.concatenate(got) == [1, 2]).all()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"remainder": "pad"},
        {"shuffle": True, "seed": 7, "shuffle_buffer_rows": 32},
        {"shuffle": True, "seed": 7, "shuffle_buffer_rows": 32, "remainder": "pad", "prefetch": 0},
    ],
    ids=["plain-drop", "plain-pad", "shuffle-drop", "shuffle-pad-noprefetch"],
)
def test_conformance_committed(env, committed, kw):
    from slicefeed.pipelines import JaxLoader

    uri, n = committed

    def make(state):
        return JaxLoader(uri, global_batch_size=16, num_epochs=2, state=state, **kw)

    steps = make(None).steps_per_epoch
    assert steps == (n // 16 if kw.get("remainder", "drop") == "drop" else -(-n // 16))
    # resume points: inside epoch 1, at the epoch boundary, inside epoch 2, last batch
    ref = assert_equal_output_after_checkpoint(
        make, [3, steps, steps + 2, 2 * steps - 1], check_batch=check_values
    )
    assert len(ref) == 2 * steps
    if kw.get("shuffle"):
        assert ref[:steps] != ref[steps:]  # epochs are shuffled differently


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_conformance_dataset_source(env, shuffle):
    import ray

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(make_table(0, 70)).repartition(3)

    def make(state):
        return JaxLoader(
            ds,
            global_batch_size=8,
            num_epochs=2,
            remainder="pad",
            shuffle=shuffle,
            shuffle_buffer_rows=16,
            seed=5,
            state=state,
        )

    ref = assert_equal_output_after_checkpoint(make, [2, 9, 12], check_batch=check_values)
    assert len(ref) == 18


def test_shuffle_of_a_dataset_depends_on_its_rows_not_its_blocks(env):
    """A shuffled Dataset source was shuffled by Ray's local shuffle buffer,
    whose order follows how the rows arrive in blocks. A source that cuts the
    same rows into other blocks on every run (a mixture: Ray's sort samples its
    boundaries) gave another order for the same seed, so a resume, which
    replays the epoch and skips the batches already delivered, delivered some
    rows twice and others never."""
    import ray

    from slicefeed.pipelines import JaxLoader

    table = make_table(0, 80)

    def cut(sizes):
        starts = np.cumsum([0, *sizes[:-1]])
        return ray.data.from_arrow([table.slice(a, n) for a, n in zip(starts, sizes)])

    def make(ds, state=None):
        return JaxLoader(ds, global_batch_size=8, shuffle=True, seed=1, shuffle_buffer_rows=16,
                         remainder="pad", state=state)

    def ids(loader, steps=None):
        out = []
        for batch in loader:
            out.append(np.asarray(batch["id"])[np.asarray(batch["mask"])].tolist())
            if steps is not None and len(out) == steps:
                break
        return out

    first = ids(make(cut([9, 7, 12, 10, 9, 9, 8, 7, 9])))
    assert ids(make(cut([8, 13, 8, 9, 8, 10, 8, 7, 9]))) == first
    assert sorted(i for b in first for i in b) == list(range(80))
    stopped = make(cut([40, 40]))
    head = ids(stopped, steps=5)
    rest = ids(make(cut([1] * 80), state=stopped.state_dict()))
    assert head + rest == first


def test_shuffle_buffer_is_a_function_of_the_rows_and_takes_any_block_types(env):
    """The loader's shuffle buffer depends on the rows' order and the seed
    only, however the rows are cut into tables; and blocks whose types differ
    (a column all null in one, as a JSON field always null reads) are unified,
    as Ray's own buffer did (they raised "Schema at index 2 was different")."""
    import ray

    from slicefeed.pipelines import JaxLoader
    from slicefeed.pipelines._loader._sources import shuffled

    table = pa.table({"i": np.arange(333)})
    rng = np.random.default_rng(0)
    for batch, buffer in ((1, 1), (4, 16), (16, 8), (5, 7)):
        seen = set()
        for _ in range(4):
            cuts = np.sort(rng.integers(0, 334, size=12))
            parts = [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, 333])]
            out = list(shuffled(iter(parts), batch, buffer, 3))
            assert all(t.num_rows == batch for t in out[:-1]) and 0 < out[-1].num_rows <= batch
            ids = tuple(i for t in out for i in t["i"].to_pylist())
            assert sorted(ids) == list(range(333))
            seen.add(ids)
        assert len(seen) == 1, (batch, buffer)
    blocks = [pa.table({"id": pa.array(np.arange(0, 8), pa.int32()),
                        "note": pa.array([None] * 8, pa.null())}),
              pa.table({"id": pa.array(np.arange(8, 16), pa.int32()), "note": ["n"] * 8})]
    got = [np.asarray(b["id"]) for b in JaxLoader(ray.data.from_arrow(blocks), columns=["id"],
                                                  global_batch_size=8, shuffle=True, seed=2)]
    assert sorted(np.concatenate(got).tolist()) == list(range(16))


def test_resume_in_fresh_process(env, committed, ray_address):
    """Consume k batches, save the state, continue in a new OS process (inside epoch 2)."""
    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    kw = {"global_batch_size": 16, "num_epochs": 2, "shuffle": True, "seed": 11, "shuffle_buffer_rows": 48}
    ref = digests(JaxLoader(uri, **kw))
    steps = len(ref) // 2
    for k in (steps + 3,):  # inside the second epoch
        loader = JaxLoader(uri, **kw)
        head = digests(loader, limit=k)
        state = loader.state_dict()
        loader.close()
        assert state["epoch"] == 1 and state["step"] == 3
        p = run_worker(
            "_resume_worker.py",
            {"address": ray_address, "uri": uri, "kwargs": kw, "state": state},
        )
        out = wait_all([p], timeout=120)[0]
        line = [ln for ln in out.splitlines() if ln.startswith("DIGESTS ")][-1]
        tail = json.loads(line[len("DIGESTS "):])
        assert head + tail == ref


def test_unsupported_source_and_bad_state(env, committed):
    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    with pytest.raises(SpecError, match="unsupported source int"):
        JaxLoader(3, global_batch_size=8)
    sd = JaxLoader(uri, global_batch_size=16).state_dict()
    with pytest.raises(SpecError, match="saved with global_batch_size=16.*32"):
        JaxLoader(uri, global_batch_size=32, state=sd)
    with pytest.raises(SpecError, match="saved with seed=0"):
        JaxLoader(uri, global_batch_size=16, seed=1, state=sd)


def test_pyarrow_nested_fsl_take_bug():
    """Documents the pyarrow bug the shuffled reader works around: take() on a sliced
    fixed_size_list<fixed_size_list<...>> returns wrong rows. When this starts
    failing, pyarrow fixed it and the workaround in _read_window can go."""
    perm = np.random.default_rng(0).permutation(32)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(300, dtype=np.int32)), 2)
    full = pa.FixedSizeListArray.from_arrays(inner, 3)
    sliced = full.slice(4, 32)
    expected = [sliced.to_pylist()[i] for i in perm]
    assert sliced.take(pa.array(perm)).to_pylist() != expected  # the bug
    assert full.take(pa.array(perm + 4)).to_pylist() == expected  # the workaround


def test_committed_uri_local_and_gcs(env, base_uri):
    """A committed dataset by URI (local path with spaces, or gs:// on the emulator)."""
    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._data import write_committed

    n = write_committed(base_uri, [20, 13, 31])
    with JaxLoader(base_uri, global_batch_size=8, remainder="pad", shuffle=True) as loader:
        assert loader.steps_per_epoch == 8
        batches = list(loader)
    for b in batches:
        check_values(b)
    ids = np.concatenate([_ids(b) for b in batches])
    assert sorted(ids.tolist()) == list(range(n))


def test_pipeline_source(env):
    """Anything with a .dataset() method (a slicefeed Pipeline) is a source."""
    import ray

    from slicefeed.pipelines import JaxLoader

    class Pipe:
        def dataset(self):
            return ray.data.from_arrow(make_table(0, 24))

    batches = list(JaxLoader(Pipe(), global_batch_size=8, columns=["id"]))
    assert [sorted(np.asarray(b["id"]).tolist()) for b in batches] == [
        list(range(i, i + 8)) for i in (0, 8, 16)
    ]

    class Bad:
        def dataset(self):
            return [1, 2]

    with pytest.raises(SpecError, match=r"Bad.dataset\(\) returned list"):
        JaxLoader(Bad(), global_batch_size=8)
