"""Fixed-shape outputs are ``arrow.fixed_shape_tensor`` columns; every transform
that takes a fixed-size column reads the older ``fixed_size_list`` layout too."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from slicefeed.transforms import (
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    Cast,
    CenterCrop,
    DecodeImage,
    Filter,
    NormalizeImage,
    PackSequences,
    PadOrTruncate,
    RandomCrop,
    RandomFlip,
    Resize,
    Vocabulary,
    apply_transforms,
    as_bfloat16,
    check_transforms,
    is_bfloat16_field,
    read_images,
    split_errors,
)


def _tensor(dt: pa.DataType, *shape: int) -> pa.DataType:
    return pa.fixed_shape_tensor(dt, shape)


def _dense(col: pa.ChunkedArray) -> np.ndarray:
    """A tensor column as the dense array any Arrow consumer gets from it."""
    return col.combine_chunks().to_numpy_ndarray()


def _check_schema(out: pa.Table, schema_in: pa.Schema, chain: list) -> None:
    # What the static check (slicefeed validate, JaxLoader(pipeline)) reports is what runs write.
    assert split_errors(out)[0].schema == check_transforms(schema_in, chain)


def _lists() -> pa.Table:
    return pa.table({
        "ids": pa.array([[1, 2, 3, 4, 5], [6], [7, 8], None], pa.list_(pa.int32())),
        PROVENANCE_FILE: ["f"] * 4,
        PROVENANCE_ROW: pa.array(range(4), pa.int64()),
    })


def test_pack_and_pad_write_tensor_columns():
    tbl = _lists()
    chain = [PackSequences(column="ids", seq_len=4)]
    out = apply_transforms(tbl, chain, on_error="quarantine")
    _check_schema(out, tbl.schema, chain)
    for c in ("tokens", "segment_ids", "positions"):
        assert out.schema.field(c).type == _tensor(pa.int32(), 4)
    good, _ = split_errors(out)
    assert _dense(good.column("tokens")).tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert _dense(good.column("segment_ids")).tolist() == [[1, 1, 1, 1], [1, 2, 3, 3]]

    chain = [PadOrTruncate("ids", 3, pad_value=-1, mask=True)]
    out = apply_transforms(tbl, chain, on_error="quarantine")
    _check_schema(out, tbl.schema, chain)
    assert out.schema.field("ids").type == _tensor(pa.int32(), 3)
    # Ray Data and pyarrow cannot make a dense array of a bool tensor: the mask is 0/1 uint8.
    assert out.schema.field("ids_mask").type == _tensor(pa.uint8(), 3)
    good, _ = split_errors(out)
    assert _dense(good.column("ids")).tolist() == [[1, 2, 3], [6, -1, -1], [7, 8, -1]]
    assert _dense(good.column("ids_mask")).tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]


def _png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _images(n: int = 4) -> pa.Table:
    rng = np.random.default_rng(0)
    data = [_png(rng.integers(0, 256, (10 + i, 12 + 2 * i, 3), dtype=np.uint8)) for i in range(n)]
    return pa.table({
        "image": pa.array(data, pa.binary()),
        PROVENANCE_FILE: ["imgs/a.parquet"] * n,
        PROVENANCE_ROW: pa.array(range(n), pa.int64()),
    })


def test_fixed_images_are_tensor_columns_and_bfloat16_metadata_survives_parquet(tmp_path):
    tbl = _images()
    chain = [DecodeImage(), Resize(height=8, width=6), NormalizeImage(mean=0.5, std=0.5, dtype="bfloat16")]
    out = apply_transforms(tbl, chain)
    _check_schema(out, tbl.schema, chain)
    f = out.schema.field("image")
    assert f.type == _tensor(pa.uint16(), 8, 6, 3) and is_bfloat16_field(f)
    assert apply_transforms(tbl, chain[:2]).schema.field("image").type == _tensor(pa.uint8(), 8, 6, 3)
    path = str(tmp_path / "x.parquet")
    pq.write_table(out, path)
    back = pq.read_table(path)
    # The extension type and the bfloat16 field metadata both come back from Parquet.
    assert back.schema.field("image").type == f.type and is_bfloat16_field(back.schema.field("image"))
    bits = _dense(back.column("image"))
    assert bits.shape == (4, 8, 6, 3) and bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, read_images(out.column("image"))[0])
    assert -1.01 <= as_bfloat16(bits).astype(np.float32).min() < 0 < as_bfloat16(bits).astype(np.float32).max() <= 1.01


def _fsl(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The layout written before: a (nested) fixed_size_list column with the same values."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = col.storage
    shape = col.type.shape
    values = arr.flatten()
    for d in reversed(shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, d)
    return pa.FixedSizeListArray.from_arrays(
        values, shape[0], mask=arr.is_null() if arr.null_count else None
    )


def _as_layout(tbl: pa.Table, layout: str) -> pa.Table:
    if layout == "tensor":
        return tbl
    for i, f in enumerate(tbl.schema):
        if isinstance(f.type, pa.FixedShapeTensorType):
            arr = _fsl(tbl.column(i))
            tbl = tbl.set_column(i, pa.field(f.name, arr.type, metadata=f.metadata), arr)
    return tbl


def _ids(layout: str) -> pa.Table:
    tbl = pa.table({
        "ids": pa.ExtensionArray.from_storage(
            _tensor(pa.int32(), 3),
            pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int32) % 5), 3),
        ),
        "n": pa.array([0, 1, 2, 3], pa.int32()),
        PROVENANCE_FILE: ["f"] * 4,
        PROVENANCE_ROW: pa.array(range(4), pa.int64()),
    })
    return _as_layout(tbl, layout)


def _values(col: pa.ChunkedArray) -> np.ndarray:
    col = col.combine_chunks()
    if isinstance(col.type, pa.FixedShapeTensorType):
        return col.to_numpy_ndarray()
    return np.array(col.to_pylist())


_ID_CHAINS = {
    "pack_sequences": lambda: [PackSequences(column="ids", seq_len=4, strategy="concat")],
    "pad_or_truncate": lambda: [PadOrTruncate("ids", 5, pad_value=9, side="left", mask=True)],
    "cast": lambda: [Cast({"ids": "int16"})],
    "cast_bfloat16": lambda: [Cast({"ids": "bfloat16"})],
    "vocabulary": lambda: [Vocabulary("ids", vocab=(4, 0, 2), first_id=10, output="v")],
    "filter": lambda: [Filter("n >= 2")],
}


@pytest.mark.parametrize("name", sorted(_ID_CHAINS))
def test_list_transforms_accept_both_layouts(name):
    results = {}
    for layout in ("fixed_size_list", "tensor"):
        tbl = _ids(layout)
        chain = _ID_CHAINS[name]()
        out = apply_transforms(tbl, chain)
        _check_schema(out, tbl.schema, chain)
        good, bad = split_errors(out)
        assert bad.num_rows == 0
        results[layout] = {c: _values(good.column(c)) for c in good.column_names}
        # Same kind out as in: a tensor column stays a tensor, an old column keeps its layout
        # unless the transform writes a fixed-shape output (always a tensor).
        writes_new = name in ("pack_sequences", "pad_or_truncate")
        for f in good.schema:
            if f.name in ("ids", "v", "tokens"):
                assert isinstance(f.type, pa.FixedShapeTensorType) == (writes_new or layout == "tensor"), f
        if name == "cast_bfloat16":
            assert is_bfloat16_field(good.schema.field("ids"))
    assert results["fixed_size_list"].keys() == results["tensor"].keys()
    for c, v in results["tensor"].items():
        np.testing.assert_array_equal(results["fixed_size_list"][c], v, err_msg=c)


def _fixed_images(layout: str) -> pa.Table:
    return _as_layout(apply_transforms(_images(), [DecodeImage(), Resize(height=10, width=12)]), layout)


_IMAGE_CHAINS = {
    "center_crop": lambda: [CenterCrop(height=6, width=8)],
    "random_crop": lambda: [RandomCrop(height=6, width=8).with_seed(3)],
    "random_flip": lambda: [RandomFlip(horizontal=True, vertical=True).with_seed(3)],
    "resize": lambda: [Resize(height=5, width=7)],
    "normalize": lambda: [NormalizeImage(mean=0.5, std=0.25, dtype="float32")],
}


@pytest.mark.parametrize("name", sorted(_IMAGE_CHAINS))
def test_image_transforms_accept_both_layouts(name):
    outs = {}
    for layout in ("fixed_size_list", "tensor"):
        tbl = _fixed_images(layout)
        chain = _IMAGE_CHAINS[name]()
        out = apply_transforms(tbl, chain)
        _check_schema(out, tbl.schema, chain)
        assert isinstance(out.schema.field("image").type, pa.FixedShapeTensorType)
        outs[layout] = read_images(out.column("image"))[0]
    np.testing.assert_array_equal(outs["fixed_size_list"], outs["tensor"])
    np.testing.assert_array_equal(
        read_images(_fixed_images("fixed_size_list").column("image"))[0],
        read_images(_fixed_images("tensor").column("image"))[0],
    )


def test_permuted_tensors_are_refused_by_the_schema_check():
    from slicefeed.connectors import SpecError

    for shape, perm, chain in (
        ((4, 2), [1, 0], [PadOrTruncate("x", 3)]),
        ((6, 4, 3), [1, 0, 2], [CenterCrop(height=2, width=2)]),
    ):
        t = pa.fixed_shape_tensor(pa.uint8(), shape, permutation=perm)
        with pytest.raises(SpecError, match="expected"):
            check_transforms(pa.schema([pa.field("x" if len(shape) == 2 else "image", t)]), chain)
