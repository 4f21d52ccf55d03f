"""The built-in recipes end to end on generated data, through the real pipeline runner."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from slicefeed.connectors import SpecError, read_manifest
from slicefeed.pipelines import load_pipeline
from slicefeed.pipelines.recipes import RECIPES, recipe_path
from slicefeed.transforms import as_bfloat16, read_images


def _read(uri: str) -> pa.Table:
    m = read_manifest(uri)
    return pa.concat_tables([pq.read_table(os.path.join(uri, f.path)) for f in m.files])


def test_recipe_names():
    assert set(RECIPES) == {"text_lm", "image_classification", "tabular"}
    for r in RECIPES:
        load_pipeline(recipe_path(r))  # validates spec and transform arguments
    with pytest.raises(SpecError, match=r"unknown recipe 'text'; built-in recipes: text_lm, image_classification, tabular"):
        recipe_path("text")


def _ray_reads_what_jaxloader_delivers(uri: str, batch_size: int = 8) -> int:
    """Ray's plain ``read_parquet(...).iter_jax_batches`` (no collate_fn) gives the
    arrays JaxLoader gives for the committed dataset ``uri``; returns the batch count.

    bfloat16 columns: Ray does not read slicefeed's field metadata, so it delivers
    the uint16 bits that JaxLoader delivers as bfloat16 (same bits).
    """
    import ray

    from slicefeed.pipelines import JaxLoader

    paths = [os.path.join(uri, f.path) for f in read_manifest(uri).files]
    ctx = ray.data.DataContext.get_current()
    keep_order = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        theirs = list(ray.data.read_parquet(paths).iter_jax_batches(batch_size=batch_size, drop_last=True))
    finally:
        ctx.execution_options.preserve_order = keep_order
    ours = list(JaxLoader(uri, global_batch_size=batch_size, remainder="drop", prefetch=1))
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert sorted(a) == sorted(b)
        for k in a:
            want = np.asarray(a[k])
            want = want.view(np.uint16) if want.dtype.name == "bfloat16" else want
            got = np.asarray(b[k])
            assert got.dtype == want.dtype and got.shape == want.shape, (k, got.dtype, got.shape)
            np.testing.assert_array_equal(got, want, err_msg=k)
            assert b[k].sharding == a[k].sharding
    return len(ours)


@pytest.mark.slow
def test_text_lm_recipe(local_dir, ray_cluster, jax_cpu):
    raw = os.path.join(local_dir, "corpus")
    os.makedirs(raw)
    rng = np.random.default_rng(0)
    texts = []
    for f in range(2):
        with open(os.path.join(raw, f"docs-{f}.jsonl"), "w") as out:
            for i in range(60):
                text = "".join(rng.choice(list("abcdefgh é✓ "), size=int(rng.integers(1, 90))))
                if f == 1 and i == 7:
                    out.write(json.dumps({"text": None}) + "\n")
                    continue
                texts.append(text)
                out.write(json.dumps({"text": text, "id": i}) + "\n")
    sink = os.path.join(local_dir, "packed")
    p = load_pipeline(
        recipe_path("text_lm"),
        [f"source.uri={raw}", f"sink.uri={sink}", "transforms.1.pack_sequences.seq_len=128",
         "max_error_fraction=0.05"],
    )
    report = p.run()
    assert report.rows_read == 120 and report.rows_quarantined == 1
    out = _read(sink)
    assert out.column_names == ["tokens", "segment_ids", "positions"]
    assert out.schema.field("tokens").type == pa.fixed_shape_tensor(pa.int32(), (128,))
    seg = out.column("segment_ids").combine_chunks().to_numpy_ndarray()
    tok = out.column("tokens").combine_chunks().to_numpy_ndarray()
    # Every byte of every good document plus one EOS each, nothing lost.
    assert (seg != 0).sum() == sum(len(t.encode()) + 1 for t in texts)
    assert (tok == 2).sum() == len(texts)
    efficiency = (seg != 0).mean()
    assert efficiency > 0.8, efficiency  # packed per block: each block ends in a partial row
    q = pq.read_table(os.path.join(sink, "_quarantine"))
    assert q.column("_sf_error").to_pylist() == ["Tokenize: column 'text' is null"]
    assert q.column("_sf_row").to_pylist() == [7] and q.column("_sf_file")[0].as_py().endswith("docs-1.jsonl")
    assert _ray_reads_what_jaxloader_delivers(sink) == out.num_rows // 8


def _png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def image_data(local_dir) -> str:
    root = os.path.join(local_dir, "images")
    os.makedirs(os.path.join(root, "img"))
    rows = ["path,label"]
    rng = np.random.default_rng(1)
    for i in range(10):
        name = f"img/{i:03d}.png"
        with open(os.path.join(root, name), "wb") as f:
            f.write(_png(rng.integers(0, 256, (20 + i, 26 - i, 3), dtype=np.uint8)))
        rows.append(f"{name},{i % 3}")
    with open(os.path.join(root, "img", "broken.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n garbage")
    rows.append("img/broken.png,1")
    with open(os.path.join(root, "labels.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    return root


def _image_run(root: str, sink: str, seed: int):
    return load_pipeline(
        recipe_path("image_classification"),
        [
            f"source.uri={root}/labels.csv",
            f"transforms.0.decode_image.root={root}",
            "transforms.1.resize.shorter_side=16",
            "transforms.2.random_crop.height=12",
            "transforms.2.random_crop.width=12",
            f"sink.uri={sink}",
            f"seed={seed}",
            "max_error_fraction=0.2",
        ],
    ).run()


@pytest.mark.slow
def test_image_recipe_deterministic_by_seed(image_data, local_dir, ray_cluster, jax_cpu):
    a = os.path.join(local_dir, "run-a")
    report = _image_run(image_data, a, seed=0)
    assert report.rows_read == 11 and report.rows_written == 10 and report.rows_quarantined == 1
    out = _read(a)
    assert out.column_names == ["image", "label"]
    assert out.schema.field("label").type == pa.int32()
    bits, valid = read_images(out.column("image"))
    assert bits.shape == (10, 12, 12, 3) and bits.dtype == np.uint16 and valid.all()
    x = as_bfloat16(bits).astype(np.float32)
    assert -2.2 < x.min() < 0 < x.max() < 2.7
    assert out.schema.field("image").type == pa.fixed_shape_tensor(pa.uint16(), (12, 12, 3))
    assert _ray_reads_what_jaxloader_delivers(a, batch_size=8) == 1
    q = pq.read_table(os.path.join(a, "_quarantine"))
    assert "DecodeImage: cannot decode image in column 'path'" in q.column("_sf_error")[0].as_py()
    # Same pipeline, same seed -> identical committed shards (manifest checksums).
    b = os.path.join(local_dir, "run-b")
    _image_run(image_data, b, seed=0)
    sums = lambda uri: [(f.num_rows, f.sha256) for f in read_manifest(uri).files]
    assert sums(a) == sums(b)
    # Another seed -> other crops/flips.
    c = os.path.join(local_dir, "run-c")
    _image_run(image_data, c, seed=1)
    assert sums(c) != sums(a)
    assert not _read(c).column("image").equals(out.column("image"))
    assert _read(c).column("label").equals(out.column("label"))


@pytest.mark.slow
def test_tabular_recipe(local_dir, ray_cluster):
    raw = os.path.join(local_dir, "tabular")
    os.makedirs(raw)
    rng = np.random.default_rng(2)
    ages, incomes = [], []
    for f in range(2):
        lines = ["age,income,city,label"]
        for i in range(50):
            age = int(rng.integers(18, 90))
            income = float(np.round(rng.normal(50_000, 15_000), 2))
            city = ["berlin", "paris", "", "oslo"][i % 4]
            if i % 10 == 3:
                lines.append(f",{income},{city},{i % 2}")
                ages.append(0)
            else:
                lines.append(f"{age},{income},{city},{i % 2}")
                ages.append(age)
            incomes.append(income)
        with open(os.path.join(raw, f"part-{f}.csv"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    sink = os.path.join(local_dir, "features")
    report = load_pipeline(recipe_path("tabular"), [f"source.uri={raw}", f"sink.uri={sink}"]).run()
    assert report.rows_written == 100
    out = _read(sink)
    assert out.schema == pa.schema(
        [("age", pa.float32()), ("income", pa.float32()), ("city_bucket", pa.int32()), ("label", pa.int32())]
    )
    age = out.column("age").to_numpy()
    assert abs(age.mean()) < 1e-5 and abs(age.std() - 1) < 1e-3
    stats = next(v for k, v in report.fit_stats.items() if k.endswith("standardize"))
    assert stats["mean"]["age"] == pytest.approx(np.mean(ages))
    assert stats["std"]["income"] == pytest.approx(np.std(incomes), rel=1e-6)
    assert read_manifest(sink).metadata["fit_stats"] == json.loads(json.dumps(report.fit_stats))
    assert out.column("city_bucket").null_count == 0


def test_text_recipe_report_counts_packing_not_as_filtered(ray_cluster, local_dir):
    import json
    import os

    from slicefeed.pipelines import load_pipeline
    from slicefeed.pipelines.recipes import recipe_path

    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.writelines(json.dumps({"text": "word " * (i + 1)}) + "\n" for i in range(40))
    p = load_pipeline(recipe_path("text_lm"), [f"source.uri={raw}",
                                              f"sink.uri={os.path.join(local_dir, 'out')}"])
    r = p.run()
    assert r.rows_filtered == 0 and r.rows_quarantined == 0
    assert r.reshaped["pack_sequences"]["rows_in"] == r.rows_read == 40
    assert r.reshaped["pack_sequences"]["rows_out"] == r.rows_written >= 1
    assert "pack_sequences turned 40 rows into" in r.summary()
    # Packing efficiency, as a report field: non-padding slots of what was written.
    import glob

    import numpy as np
    import pyarrow.parquet as pq

    files = [f for f in glob.glob(os.path.join(local_dir, "out", "*.parquet"))]
    seg = np.concatenate([pq.read_table(f, columns=["segment_ids"]).column(0).combine_chunks()
                          .to_numpy_ndarray().ravel() for f in files])
    pack = next(t for t in r.transforms if t["name"] == "pack_sequences")
    assert pack["rows_in"] == 40 and pack["rows_out"] == r.rows_written
    assert pack["packing_efficiency"] == pytest.approx((seg != 0).mean(), abs=1e-4)
    assert r.packing_efficiency == pack["packing_efficiency"]
    assert r.to_dict()["packing_efficiency"] == pack["packing_efficiency"]
    assert "packing efficiency" in r.summary()
