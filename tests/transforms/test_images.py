"""Image transforms on images generated with Pillow in the test."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from slicefeed.connectors import SpecError
from slicefeed.transforms import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    CenterCrop,
    DecodeImage,
    NormalizeImage,
    RandomCrop,
    RandomFlip,
    Resize,
    apply_transforms,
    as_bfloat16,
    check_transforms,
    is_bfloat16_field,
    read_images,
    split_errors,
)


def _pixels(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _encode(a: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt)
    return buf.getvalue()


def _table(n: int = 6, file: str = "imgs/part-0.parquet") -> tuple[pa.Table, list[np.ndarray]]:
    arrays = [_pixels(16 + 3 * i, 20 + 2 * i, i) for i in range(n)]
    data = [_encode(a, "PNG" if i % 2 else "JPEG") for i, a in enumerate(arrays)]
    tbl = pa.table(
        {
            "image": pa.array(data, pa.binary()),
            "label": list(range(n)),
            PROVENANCE_FILE: [file] * n,
            PROVENANCE_ROW: pa.array(range(n), pa.int64()),
        }
    )
    return tbl, arrays


def test_decode_png_exact_and_jpeg_close():
    tbl, arrays = _table()
    out = DecodeImage()(tbl)
    assert out.schema == DecodeImage().output_schema(tbl.schema)
    images, valid = read_images(out.column("image"))
    assert valid.all()
    for i, (im, src) in enumerate(zip(images, arrays)):
        assert im.shape == src.shape
        if i % 2:  # PNG is lossless
            np.testing.assert_array_equal(im, src)
    gray = DecodeImage(mode="L")(tbl)
    assert read_images(gray.column("image"))[0][1].shape == (19, 22, 1)


def test_decode_paths(tmp_path):
    a = _pixels(8, 9, 1)
    p = tmp_path / "with space.png"
    p.write_bytes(_encode(a))
    out = DecodeImage(column="path", output="image", root=str(tmp_path))(
        pa.table({"path": ["with space.png"]})
    )
    np.testing.assert_array_equal(read_images(out.column("image"))[0][0], a)


def test_bad_images_follow_bad_record_policy(tmp_path):
    tbl, _ = _table(4)
    data = tbl.column("image").to_pylist()
    data[1] = b"not an image at all"
    data[2] = data[2][:40]  # truncated PNG
    tbl = tbl.set_column(0, "image", pa.array(data, pa.binary()))
    out = DecodeImage()(tbl)
    good, bad = split_errors(out)
    assert good.column("label").to_pylist() == [0, 3]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [1, 2]
    reasons = bad.column(ERROR_COLUMN).to_pylist()
    assert reasons[0].startswith(
        "DecodeImage: cannot decode image in column 'image' (19 bytes): UnidentifiedImageError"
    )
    assert "0x" not in reasons[0]  # reproducible text (no object addresses)
    with pytest.raises(Exception, match=r"bad record at file 'imgs/part-0.parquet' row 1"):
        apply_transforms(tbl, [DecodeImage()])
    missing = DecodeImage(column="p", root=str(tmp_path))(pa.table({"p": ["nope.png"]}))
    assert "DecodeImage: cannot decode image in column 'p' (path" in missing.column(ERROR_COLUMN)[0].as_py()


def _chain(seed: int, file: str = "imgs/part-0.parquet"):
    return [
        DecodeImage(),
        Resize(shorter_side=24),
        RandomCrop(height=16, width=16).with_seed(seed),
        RandomFlip(horizontal=True, vertical=True).with_seed(seed),
        NormalizeImage(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25], dtype="float32"),
    ]


def test_full_chain_shapes_and_schema():
    tbl, _ = _table()
    chain = _chain(0)
    out = apply_transforms(tbl, chain)
    assert out.schema == check_transforms(tbl.schema, chain)
    images, _ = read_images(out.column("image"))
    assert images.shape == (6, 16, 16, 3) and images.dtype == np.float32
    assert -2.0 - 1e-6 <= images.min() and images.max() <= 2.0 + 1e-6


def test_random_ops_deterministic_by_seed_and_row_identity():
    tbl, _ = _table(8)
    a = apply_transforms(tbl, _chain(1))
    b = apply_transforms(tbl, _chain(1))
    assert a.equals(b)
    # Same rows in a different batch composition -> same pixels (row identity, not position).
    parts = [apply_transforms(tbl.slice(i, 3), _chain(1)) for i in range(0, 8, 3)]
    assert pa.concat_tables(parts).equals(a)
    c = apply_transforms(tbl, _chain(2))
    assert not c.column("image").equals(a.column("image"))
    # A seed given explicitly wins over the pipeline's.
    assert RandomCrop(seed=5).with_seed(9).seed == 5 and RandomCrop().with_seed(9).seed == 9


def test_random_crop_and_flip_are_random_per_row():
    n = 64
    a = np.tile(np.arange(32, dtype=np.uint8)[None, :, None], (32, 1, 3))  # x-gradient
    tbl = pa.table(
        {
            "image": [_encode(a)] * n,
            PROVENANCE_FILE: ["f"] * n,
            PROVENANCE_ROW: pa.array(range(n), pa.int64()),
        }
    )
    crops = apply_transforms(tbl, [DecodeImage(), Resize(height=32, width=32), RandomCrop(height=8, width=8, seed=3)])
    imgs, _ = read_images(crops.column("image"))
    x0 = imgs[:, 0, 0, 0]
    assert len(set(x0.tolist())) > 10 and x0.min() >= 0 and x0.max() <= 24
    # Each crop is a contiguous window of the gradient.
    np.testing.assert_array_equal(imgs[:, 0, :, 0], x0[:, None] + np.arange(8))
    flips = apply_transforms(crops, [RandomFlip(seed=3, p=0.5)])
    fimgs, _ = read_images(flips.column("image"))
    flipped = fimgs[:, 0, 0, 0] != imgs[:, 0, 0, 0]
    assert 10 < flipped.sum() < 54
    np.testing.assert_array_equal(fimgs[flipped], imgs[flipped][:, :, ::-1])
    none = apply_transforms(crops, [RandomFlip(seed=3, p=0.0)])
    assert none.column("image").equals(crops.column("image"))


def test_center_crop_variable_and_fixed_agree():
    tbl, _ = _table(4)
    dec = apply_transforms(tbl, [DecodeImage()])
    via_var = CenterCrop(height=10, width=12)(dec)
    via_fixed = CenterCrop(height=10, width=12)(Resize(height=16, width=20)(dec))
    src, _ = read_images(dec.column("image"))
    got, _ = read_images(via_var.column("image"))
    H, W = src[0].shape[:2]
    np.testing.assert_array_equal(got[0], src[0][(H - 10) // 2 : (H - 10) // 2 + 10, (W - 12) // 2 : (W - 12) // 2 + 12])
    assert via_fixed.schema.field("image").type == via_var.schema.field("image").type


def test_crop_larger_than_image_is_bad_record():
    tbl, _ = _table(3)
    out = CenterCrop(height=18, width=18)(apply_transforms(tbl, [DecodeImage()]))
    good, bad = split_errors(out)
    assert good.column("label").to_pylist() == [1, 2]
    assert bad.column(ERROR_COLUMN).to_pylist() == [
        "CenterCrop: image 16x20 is smaller than the crop 18x18; resize first"
    ]


def test_normalize_dtypes():
    tbl, _ = _table(2)
    fixed = apply_transforms(tbl, [DecodeImage(), Resize(height=4, width=5)])
    raw, _ = read_images(fixed.column("image"))
    u8 = NormalizeImage(dtype="uint8")(fixed)
    np.testing.assert_array_equal(read_images(u8.column("image"))[0], raw)
    f32 = NormalizeImage(mean=0.5, std=0.5)(fixed)
    expect = (raw.astype(np.float32) / 255 - 0.5) / 0.5
    np.testing.assert_allclose(read_images(f32.column("image"))[0], expect, atol=1e-6)
    bf = NormalizeImage(mean=0.5, std=0.5, dtype="bfloat16")(fixed)
    f = bf.schema.field("image")
    assert is_bfloat16_field(f) and bf.schema == NormalizeImage(mean=0.5, std=0.5, dtype="bfloat16").output_schema(fixed.schema)
    bits, _ = read_images(bf.column("image"))
    np.testing.assert_allclose(as_bfloat16(bits).astype(np.float32), expect, atol=1e-2)


def test_image_schema_errors():
    tbl, _ = _table(1)
    s = tbl.schema
    dec = DecodeImage().output_schema(s)
    with pytest.raises(SpecError, match=r"^DecodeImage: column 'img' not found; available: image, label\."):
        DecodeImage(column="img").output_schema(s)
    with pytest.raises(SpecError, match=r"DecodeImage: column 'label' has type int64; expected binary or string"):
        DecodeImage(column="label").output_schema(s)
    with pytest.raises(SpecError, match=r"DecodeImage: unknown mode 'CMYK'; allowed: RGB, L, RGBA"):
        DecodeImage(mode="CMYK")
    with pytest.raises(SpecError, match=r"Resize: column 'image' has type binary; expected a uint8 image column \(add DecodeImage first"):
        Resize(height=2, width=2).output_schema(s)
    with pytest.raises(SpecError, match=r"Resize: give either height and width \(exact size\) or shorter_side"):
        Resize(height=3)
    with pytest.raises(SpecError, match=r"Resize: unknown resample 'cubic'; allowed: nearest"):
        Resize(shorter_side=3, resample="cubic")
    with pytest.raises(SpecError, match=r"CenterCrop: column 'image' holds 4x4 images, smaller than the crop 8x8"):
        CenterCrop(height=8, width=8).output_schema(Resize(height=4, width=4).output_schema(dec))
    with pytest.raises(SpecError, match=r"RandomCrop: needs the row identity columns '_sf_file' and '_sf_row'"):
        RandomCrop(height=2, width=2).output_schema(DecodeImage().output_schema(pa.schema([("image", pa.binary())])))
    with pytest.raises(SpecError, match=r"RandomFlip: p must be a probability in \[0, 1\]; got 2"):
        RandomFlip(p=2)
    with pytest.raises(SpecError, match=r"RandomFlip: column 'label' has type int64; expected a uint8 image column"):
        RandomFlip(column="label").output_schema(s)
    with pytest.raises(SpecError, match=r"NormalizeImage: column 'image' holds images of varying size; add Resize"):
        NormalizeImage().output_schema(dec)
    with pytest.raises(SpecError, match=r"NormalizeImage: unknown dtype 'float16'; allowed: uint8, float32, bfloat16"):
        NormalizeImage(dtype="float16")
    with pytest.raises(SpecError, match=r"NormalizeImage: mean has 2 values; the image has 3 channels"):
        NormalizeImage(mean=[0.1, 0.2]).output_schema(Resize(height=2, width=2).output_schema(dec))
    with pytest.raises(SpecError, match=r"NormalizeImage: std must be positive"):
        NormalizeImage(std=0)


def test_decode_with_size_equals_decode_then_resize():
    tbl, _ = _table(5)
    fused = DecodeImage(height=12, width=10, draft=False)(tbl)
    two = Resize(height=12, width=10)(DecodeImage()(tbl))
    assert fused.schema == DecodeImage(height=12, width=10).output_schema(tbl.schema) == two.schema
    assert fused.column("image").equals(two.column("image"))
    # PNGs are never drafted: bit-exact with the default too.
    drafted = read_images(DecodeImage(height=12, width=10)(tbl).column("image"))[0]
    np.testing.assert_array_equal(drafted[1::2], read_images(two.column("image"))[0][1::2])
    with pytest.raises(SpecError, match=r"DecodeImage: give both height and width"):
        DecodeImage(height=3)


def test_jpeg_draft_decoding_stays_within_tolerance_of_full_decode():
    """draft lets libjpeg decode at 1/2..1/8 scale before the resize: faster, and
    on smooth content within a couple of levels of a full-size decode + resize."""
    h, w = 300, 400
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1).astype(np.uint8)
    tbl = pa.table({"image": [_encode(a, "JPEG")]})
    fast = read_images(DecodeImage(height=60, width=80)(tbl).column("image"))[0].astype(int)
    full = read_images(DecodeImage(height=60, width=80, draft=False)(tbl).column("image"))[0]
    assert fast.shape == full.shape == (1, 60, 80, 3)
    diff = np.abs(fast - full.astype(int))
    assert diff.mean() <= 2.0 and diff.max() <= 16, (diff.mean(), diff.max())
    assert not (diff == 0).all()  # draft did change the decode path


def _mixed_table() -> pa.Table:
    """PNG and JPEG rows (JPEGs over twice the target size, where draft would
    scale them), a grey PNG, an undecodable row and a null."""
    arrays = [_pixels(40 + 7 * i, 52 + 5 * i, i) for i in range(6)]
    data = [_encode(a, "PNG" if i % 2 else "JPEG") for i, a in enumerate(arrays)]
    data.append(_encode(_pixels(30, 30, 9)[:, :, 0], "PNG"))  # mode L, converted to RGB
    data += [b"not an image", None]
    n = len(data)
    return pa.table({
        "image": pa.array(data, pa.binary()),
        "label": list(range(n)),
        PROVENANCE_FILE: ["imgs/part-0.parquet"] * n,
        PROVENANCE_ROW: pa.array(range(n), pa.int64()),
    })


def _unfused(tbl: pa.Table, decode: DecodeImage, resize: Resize) -> tuple[pa.Table, pa.Table]:
    """The two transforms one after the other, bad rows split off in between."""
    ok, bad = split_errors(decode(tbl))
    return resize(ok), bad


@pytest.mark.parametrize("max_batch_bytes", [None, 20_000], ids=["all_fit", "budget_refuses"])
def test_decode_then_exact_resize_fuses_bit_identically(max_batch_bytes):
    """DecodeImage() then Resize(h, w) of its column run as one pass (chain_steps,
    which pipelines and apply_transforms use): the same values, schema, bad rows
    and reasons as the two transforms, on PNG and JPEG, also where DecodeImage()'s
    max_batch_bytes refuses rows in row order."""
    from slicefeed.transforms import DecodeResize, chain_steps

    tbl = _mixed_table()
    kw = {} if max_batch_bytes is None else {"max_batch_bytes": max_batch_bytes}
    decode, resize = DecodeImage(**kw), Resize(height=12, width=10)
    steps = chain_steps([decode, resize])
    assert [(s.first, s.count) for s in steps] == [(0, 2)]
    assert isinstance(steps[0].fn, DecodeResize)

    want, want_bad = _unfused(tbl, decode, resize)
    got, got_bad = split_errors(steps[0].fn(tbl))
    assert got.schema == want.schema == check_transforms(tbl.schema, [decode, resize])
    assert got.column("label").to_pylist() == want.column("label").to_pylist()
    assert got.column("image").equals(want.column("image"))
    assert got_bad.column(PROVENANCE_ROW).to_pylist() == want_bad.column(PROVENANCE_ROW).to_pylist()
    assert got_bad.column(ERROR_COLUMN).to_pylist() == want_bad.column(ERROR_COLUMN).to_pylist()
    if max_batch_bytes:  # the budget case does refuse decodable rows
        assert "max_batch_bytes=20,000" in " ".join(got_bad.column(ERROR_COLUMN).to_pylist())
    # apply_transforms runs the fused step too, with the same result.
    out = apply_transforms(tbl, [decode, resize], on_error="skip")
    assert out.column("image").equals(want.column("image"))
    with pytest.raises(Exception, match=r"DecodeImage.*bad record at file 'imgs/part-0.parquet'"):
        apply_transforms(tbl, [decode, resize])


def test_decode_and_resize_do_not_fuse_where_results_could_differ():
    """Fusion only where it is exact: each of these chains runs transform by
    transform, and its result equals the transforms applied one by one."""
    from slicefeed.transforms import chain_steps

    tbl = _mixed_table().slice(0, 6)
    chains = [
        [DecodeImage(), Resize(shorter_side=12)],  # not an exact size
        [DecodeImage(height=20, width=20), Resize(height=12, width=10)],  # already sized (draft)
        [DecodeImage(output="pixels"), Resize(column="image", height=12, width=10)],  # other column
        [DecodeImage(), CenterCrop(height=30, width=30), Resize(height=12, width=10)],  # not adjacent
    ]
    for chain in chains:
        assert [s.count for s in chain_steps(chain)] == [1] * len(chain), chain
    for chain in chains[:2] + chains[3:]:
        want = tbl
        for t in chain:
            want = split_errors(t(want))[0]
        assert apply_transforms(tbl, chain).equals(want)
    with pytest.raises(SpecError):  # Resize of the still-encoded column is refused
        check_transforms(tbl.schema, chains[2])


def _png16(a: np.ndarray) -> bytes:
    """A 16-bit PNG of uint16 ``a``: greyscale ``(h, w)`` or RGB ``(h, w, 3)``."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    h, w = a.shape[:2]
    colour = 2 if a.ndim == 3 else 0
    rows = a.astype(">u2").reshape(h, -1).view(np.uint8)
    raw = b"".join(b"\x00" + r.tobytes() for r in rows)
    ihdr = struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def _tiff(a: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    img = Image.fromarray(a) if mode is None else Image.frombytes(mode, a.shape[::-1], a.tobytes())
    img.save(buf, format="TIFF")
    return buf.getvalue()


def test_16_bit_grey_images_scale_to_8_bits_in_every_decode_path():
    """16-bit samples map onto 0..255 by their high byte (v >> 8, as Pillow reads
    16-bit RGB), never clamped at 255: in every mode, with and without a size,
    and in the fused decode+resize pass."""
    ramp = (np.arange(48, dtype=np.uint32).reshape(6, 8) * 65535 // 47).astype(np.uint16)
    want = (ramp >> 8).astype(np.uint8)
    data = [
        _png16(ramp),  # Pillow mode I;16
        _tiff(ramp.astype(">u2"), "I;16B"),  # big-endian samples
        _tiff(ramp),  # little-endian I;16
    ]
    tbl = pa.table({"image": pa.array(data, pa.binary())})
    assert [Image.open(io.BytesIO(d)).mode for d in data] == ["I;16", "I;16B", "I;16"]
    for mode, c in (("L", 1), ("RGB", 3), ("RGBA", 4)):
        expect = np.repeat(want[:, :, None], c, axis=2)
        if mode == "RGBA":
            expect[:, :, 3] = 255
        for out in (
            apply_transforms(tbl, [DecodeImage(mode=mode)]),
            apply_transforms(tbl, [DecodeImage(mode=mode, height=6, width=8)]),
        ):
            images, valid = read_images(out.column("image"))
            assert valid.all()
            for im in images:
                np.testing.assert_array_equal(im, expect, err_msg=mode)
        # Resized: the fused pass equals the two transforms on the scaled pixels.
        fused = apply_transforms(tbl, [DecodeImage(mode=mode), Resize(height=3, width=4)])
        two = Resize(height=3, width=4)(DecodeImage(mode=mode)(tbl))
        assert fused.column("image").equals(two.column("image"))
        assert read_images(fused.column("image"))[0].max() > 128  # not clamped, not dark
    # A 16-bit RGB PNG (which Pillow reads as 8-bit RGB) with equal channels decodes
    # like the greyscale one: one rule for 16-bit samples.
    rgb = apply_transforms(pa.table({"image": [_png16(np.stack([ramp] * 3, -1))]}), [DecodeImage()])
    np.testing.assert_array_equal(read_images(rgb.column("image"))[0][0], np.stack([want] * 3, -1))


def test_32_bit_integer_and_float_images_are_bad_records_naming_the_mode():
    """32-bit integer ('I') and float ('F') samples have no standard range: the
    row is a bad record naming the Pillow mode (refused from the header, with
    and without a size), never clamped to 0/255."""
    ints = np.array([[0, 1000, 70000, 40000]], np.int32)
    floats = np.array([[0.0, 0.5, 1.0, 2.0]], np.float32)
    tbl = pa.table({
        "image": pa.array([_tiff(ints), _tiff(floats), _encode(_pixels(1, 4, 0))], pa.binary()),
        PROVENANCE_FILE: ["imgs/part-0.parquet"] * 3,
        PROVENANCE_ROW: pa.array([0, 1, 2], pa.int64()),
    })
    for decode in (DecodeImage(mode="L"), DecodeImage(mode="L", height=1, width=4)):
        ok, bad = split_errors(decode(tbl))
        assert ok.column(PROVENANCE_ROW).to_pylist() == [2]
        r_int, r_float = bad.column(ERROR_COLUMN).to_pylist()
        assert "column 'image'" in r_int and "mode 'I'" in r_int and "32-bit integer" in r_int, r_int
        assert "mode 'F'" in r_float and "32-bit float" in r_float, r_float
        assert "8- or 16-bit" in r_int
    with pytest.raises(Exception, match=r"row 0: DecodeImage: .*mode 'I'"):
        apply_transforms(tbl, [DecodeImage(mode="L")])
