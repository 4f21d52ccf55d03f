"""JaxLoader reads fixed-shape columns in both layouts: ``arrow.fixed_shape_tensor``
(what slicefeed writes) and the older plain / nested ``fixed_size_list``."""

from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines._data import commit_manifest


@pytest.fixture(scope="module")
def env(ray_cluster, jax_cpu):
    return jax_cpu


N = 40


def _columns(layout: str) -> pa.Table:
    """``tokens`` int32 (16,), ``image`` bfloat16 bits (4, 3, 2) with slicefeed's
    bfloat16 field metadata, ``label`` int32; row i's values derive from i."""
    import ml_dtypes

    from slicefeed.transforms import is_bfloat16_field

    ids = np.arange(N, dtype=np.int32)
    tokens = (ids[:, None] * 100 + np.arange(16)).astype(np.int32)
    image = ((ids[:, None] + np.arange(24)) / 8 - 1).astype(ml_dtypes.bfloat16).view(np.uint16)
    bf16 = {b"slicefeed.dtype": b"bfloat16"}
    if layout == "tensor":
        tok = pa.ExtensionArray.from_storage(
            pa.fixed_shape_tensor(pa.int32(), (16,)),
            pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), 16))
        img = pa.ExtensionArray.from_storage(
            pa.fixed_shape_tensor(pa.uint16(), (4, 3, 2)),
            pa.FixedSizeListArray.from_arrays(pa.array(image.ravel()), 24))
    else:
        tok = pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), 16)
        img = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(image.ravel()), 2), 3), 4)
    schema = pa.schema([pa.field("tokens", tok.type), pa.field("image", img.type, metadata=bf16),
                        pa.field("label", pa.int32())])
    t = pa.Table.from_arrays([tok, img, pa.array(ids % 7)], schema=schema)
    assert is_bfloat16_field(t.schema.field("image"))
    return t


def _commit(uri: str, table: pa.Table, parts: int = 2) -> None:
    from slicefeed.connectors import Manifest, ManifestFile

    os.makedirs(uri)
    files, step = [], table.num_rows // parts
    for i in range(parts):
        buf = io.BytesIO()
        pq.write_table(table.slice(i * step, step), buf, row_group_size=8)
        data = buf.getvalue()
        name = f"part-{i:05d}.parquet"
        with open(os.path.join(uri, name), "wb") as f:
            f.write(data)
        meta = pq.read_metadata(io.BytesIO(data))
        groups = tuple(meta.row_group(k).num_rows for k in range(meta.num_row_groups))
        files.append(ManifestFile(name, step, len(data), hashlib.sha256(data).hexdigest(), groups, "testdata"))
    commit_manifest(uri, Manifest(files=tuple(files), schema=table.schema))


@pytest.mark.parametrize("shuffle", [False, True])
def test_tensor_and_fixed_size_list_layouts_load_alike(env, local_dir, shuffle):
    import ml_dtypes

    from slicefeed.pipelines import JaxLoader

    got = {}
    for layout in ("fixed_size_list", "tensor"):
        uri = os.path.join(local_dir, layout)
        _commit(uri, _columns(layout))
        assert pq.read_schema(os.path.join(uri, "part-00000.parquet")).field("image").metadata
        batches = list(JaxLoader(uri, global_batch_size=8, shuffle=shuffle, seed=3, prefetch=1))
        assert len(batches) == N // 8
        b = batches[0]
        assert b["tokens"].shape == (8, 16) and b["tokens"].dtype == np.int32
        # bfloat16 bits arrive as bfloat16 in both layouts (a view: same bits).
        assert b["image"].shape == (8, 4, 3, 2) and b["image"].dtype == ml_dtypes.bfloat16
        got[layout] = {k: np.concatenate([np.asarray(x[k]) for x in batches]) for k in b}
    old, new = got["fixed_size_list"], got["tensor"]
    for k in new:
        np.testing.assert_array_equal(old[k].view(np.uint8), new[k].view(np.uint8), err_msg=k)
    ids = new["tokens"][:, 0] // 100
    assert sorted(ids.tolist()) == list(range(N)) and (ids != np.arange(N)).any() == shuffle
    np.testing.assert_array_equal(new["tokens"], ids[:, None] * 100 + np.arange(16))
    want = ((ids[:, None] + np.arange(24)) / 8 - 1).astype(ml_dtypes.bfloat16).reshape(N, 4, 3, 2)
    np.testing.assert_array_equal(new["image"].view(np.uint16), want.view(np.uint16))


def test_permuted_tensor_is_refused_not_reordered(env, local_dir):
    """A tensor stored in another dimension order cannot be a row-major view:
    refused at construction, naming the column, instead of transposed rows."""
    from slicefeed.connectors import SpecError
    from slicefeed.pipelines import JaxLoader

    t = pa.fixed_shape_tensor(pa.int32(), (2, 4), permutation=[1, 0])
    col = pa.ExtensionArray.from_storage(
        t, pa.FixedSizeListArray.from_arrays(pa.array(np.arange(N * 8, dtype=np.int32)), 8))
    uri = os.path.join(local_dir, "permuted")
    _commit(uri, pa.table({"m": col, "label": pa.array(np.arange(N, dtype=np.int32))}))
    with pytest.raises(SpecError, match=r"column 'm' is a tensor stored with dimension permutation \[1, 0\]"):
        JaxLoader(uri, global_batch_size=8)
    loader = JaxLoader(uri, global_batch_size=8, exclude=["m"])
    assert next(loader)["label"].shape == (8,)
    loader.close()


def test_pipeline_source_plans_tensor_columns_from_the_static_schema(env, local_dir):
    """JaxLoader(pipeline) plans from the static output schema (tensor columns, as
    ``slicefeed validate`` reports them) and loads the tensor blocks Ray produces."""
    import json

    from slicefeed.pipelines import JaxLoader, load_pipeline
    from slicefeed.pipelines.recipes import recipe_path

    raw = os.path.join(local_dir, "corpus")
    os.makedirs(raw)
    texts = [f"doc {i} " * (i % 5 + 1) for i in range(30)]
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    p = load_pipeline(recipe_path("text_lm"), [f"source.uri={raw}", f"sink.uri={local_dir}/out",
                                               "transforms.1.pack_sequences.seq_len=32"])
    schema = p.check()
    assert schema.field("tokens").type == pa.fixed_shape_tensor(pa.int32(), (32,))
    batches = list(JaxLoader(p, global_batch_size=8, remainder="pad", prefetch=1))
    seg = np.concatenate([np.asarray(b["segment_ids"])[np.asarray(b["mask"])] for b in batches])
    assert seg.shape[1:] == (32,) and seg.dtype == np.int32
    # Every byte of every document plus one EOS each, as dense int32 rows.
    assert (seg != 0).sum() == sum(len(t.encode()) + 1 for t in texts)


@pytest.mark.parametrize("layout", ["fixed_size_list", "tensor"])
def test_sliced_columns_convert_to_their_own_rows(layout):
    """A batch is a slice of a decoded window (an offset into Arrow's buffers),
    and a column's child values may carry an offset of their own: every level's
    offset is honoured, and the result is still a view (no copy)."""
    from slicefeed.pipelines._loader._convert import convert_table, plan_columns

    t = _columns(layout)
    # Child values with an offset of their own (a column built from a slice).
    tok = pa.FixedSizeListArray.from_arrays(
        pa.array(np.arange(16 * (N + 1), dtype=np.int32)).slice(16), 16)
    t = t.set_column(0, "tokens", tok) if layout == "fixed_size_list" else t
    specs = plan_columns(t.schema)
    whole = convert_table(specs, t)
    for lo, n in ((0, 8), (3, 5), (37, 3), (N, 0)):
        counter = [0, 0]
        part = convert_table(specs, t.slice(lo, n), counter)
        assert counter == [0, 0], (lo, n)
        for k, a in part.items():
            assert a.shape == (n,) + whole[k].shape[1:], (k, lo, n)
            np.testing.assert_array_equal(a.view(np.uint8), whole[k][lo:lo + n].view(np.uint8),
                                          err_msg=f"{k} rows {lo}:{lo + n}")
    if layout == "fixed_size_list":
        np.testing.assert_array_equal(whole["tokens"].ravel(), np.arange(16, 16 * (N + 1)))


def test_ray_tensor_columns_of_a_dataset_load_as_their_rows(env):
    """Ray Data stores an ndarray column as its own tensor extension, whose
    storage is a variable-length list (not fixed_size_list): a Dataset source
    delivers each row's tensor, also for batches cut from inside a block."""
    import ray

    from slicefeed.pipelines import JaxLoader

    x = np.arange(24 * 2 * 3, dtype=np.int32).reshape(24, 2, 3)
    ds = ray.data.from_numpy(x)  # column "data", Ray's tensor type
    assert "tensor" in str(ds.schema().types[0]).lower()
    with JaxLoader(ds, global_batch_size=8, prefetch=1) as loader:
        got = np.concatenate([np.asarray(b["data"]) for b in loader])
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("value_type", ["int32", "bool"])
def test_null_inside_a_tensor_is_refused_naming_the_column(env, local_dir, value_type):
    """A null element inside a tensor row has no value to deliver: a SpecError
    naming the column, file and row (not Arrow's zero-copy error, and never a bool null
    silently delivered as False)."""
    from slicefeed.connectors import SpecError
    from slicefeed.pipelines import JaxLoader

    vals = [(i % 2 == 1) if value_type == "bool" else i for i in range(N * 4)]
    vals[13] = None
    t = pa.fixed_shape_tensor(pa.type_for_alias(value_type), (2, 2))
    col = pa.ExtensionArray.from_storage(
        t, pa.FixedSizeListArray.from_arrays(pa.array(vals, t.value_type), 4))
    uri = os.path.join(local_dir, "nulls")
    _commit(uri, pa.table({"m": col, "label": pa.array(np.arange(N, dtype=np.int32))}))
    with (pytest.raises(SpecError, match=r"column 'm', file 'part-00000\.parquet' row 3: a null "
                                         r"value \(1 in this batch\)"),
          JaxLoader(uri, global_batch_size=8, prefetch=1) as loader):
        list(loader)


_READ_IN_FRESH_PROCESS = """
import sys
import numpy as np
from slicefeed.pipelines import JaxLoader
assert "ray.data" not in sys.modules  # nothing has registered Ray's tensor types yet
with JaxLoader(sys.argv[1], global_batch_size=8, prefetch=1) as loader:
    batches = list(loader)
np.savez(sys.argv[2], **{k: np.concatenate([np.asarray(b[k]) for b in batches])
                         for k in batches[0]})
"""


def test_committed_ray_tensor_columns_load_in_a_process_without_ray_data(env, local_dir):
    """A dataset Ray Data committed with ndarray columns names Ray's tensor
    extension in its schema; a training process that has not imported
    ``ray.data`` reads it with the same per-row shapes and values (Arrow
    would otherwise see only the variable-length list storage)."""
    import subprocess
    import sys

    import ray

    from slicefeed.connectors import read_manifest, write_parquet

    n = 16
    f = (np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4) / 4)
    i = np.arange(n * 12, dtype=np.int32).reshape(n, 3, 4) * 10
    rows = [{"f": f[k], "i": i[k], "label": np.int32(k)} for k in range(n)]
    uri = os.path.join(local_dir, "ray-tensors")
    write_parquet(ray.data.from_items(rows, override_num_blocks=2), uri)
    assert read_manifest(uri).schema.field("f").type.extension_name.startswith("ray.data.")
    out = os.path.join(local_dir, "got.npz")
    r = subprocess.run([sys.executable, "-c", _READ_IN_FRESH_PROCESS, uri, out],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(out)
    order = np.argsort(got["label"])
    np.testing.assert_array_equal(got["label"][order], np.arange(n))
    assert got["f"].shape == f.shape and got["f"].dtype == np.float32
    assert got["i"].shape == i.shape and got["i"].dtype == np.int32
    np.testing.assert_array_equal(got["f"][order], f)
    np.testing.assert_array_equal(got["i"][order], i)


def test_unregistered_ray_tensor_column_is_refused_not_flattened():
    """A Ray tensor column whose type could not be registered is only its
    variable-length list storage: refused naming the column and the type,
    even with a pad length that would deliver flattened rows."""
    from slicefeed.connectors import SpecError
    from slicefeed.pipelines._loader._convert import plan_columns

    name = {b"ARROW:extension:name": b"ray.data.arrow_tensor_v2",
            b"ARROW:extension:metadata": b"[3, 4]"}
    schema = pa.schema([pa.field("f", pa.large_list(pa.float32()), metadata=name),
                        pa.field("label", pa.int32())])
    with pytest.raises(SpecError, match=r"column 'f' was written as Ray Data's "
                                        r"ray.data.arrow_tensor_v2 type"):
        plan_columns(schema, pad_lengths={"f": 12})
    assert [s.name for s in plan_columns(schema, exclude=["f"])] == ["label"]
