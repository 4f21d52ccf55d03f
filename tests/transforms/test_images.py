"""Image transforms on images generated with Pillow in the test."""

from __future__ import annotations

import io
import itertools
import struct

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


def _image_table(data: list[bytes | None]) -> pa.Table:
    """Encoded images (or None) as a batch read from one Parquet file: ``image``,
    ``label`` (the row number) and the provenance columns."""
    n = len(data)
    return pa.table({
        "image": pa.array(data, pa.binary()),
        "label": list(range(n)),
        PROVENANCE_FILE: ["imgs/part-0.parquet"] * n,
        PROVENANCE_ROW: pa.array(range(n), pa.int64()),
    })


def _mixed_table() -> pa.Table:
    """PNG and JPEG rows (JPEGs over twice the target size, where draft would
    scale them), a grey PNG, an undecodable row and a null."""
    arrays = [_pixels(40 + 7 * i, 52 + 5 * i, i) for i in range(6)]
    data = [_encode(a, "PNG" if i % 2 else "JPEG") for i, a in enumerate(arrays)]
    data.append(_encode(_pixels(30, 30, 9)[:, :, 0], "PNG"))  # mode L, converted to RGB
    data += [b"not an image", None]
    return _image_table(data)


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


# -- EXIF orientation ---------------------------------------------------------------
#
# exif_orientation="ignore" (the default) decodes the stored pixel layout, as before the
# option existed; "apply" turns each image as it is displayed, exactly as Pillow's
# ImageOps.exif_transpose does, in every decode path, before any resize.

ORIENTATION = 0x0112  # the EXIF Orientation tag
# What each orientation does to the stored pixels to display them (the EXIF spec's
# meaning, stated independently of Pillow: 6 = rotate 90 degrees clockwise).
_DISPLAYED = {
    1: lambda x: x,
    2: lambda x: x[:, ::-1],
    3: lambda x: x[::-1, ::-1],
    4: lambda x: x[::-1],
    5: lambda x: x.transpose(1, 0, 2),
    6: lambda x: np.rot90(x, -1),
    7: lambda x: np.rot90(x, 2).transpose(1, 0, 2),
    8: lambda x: np.rot90(x, 1),
}


def _oriented(a: np.ndarray, orientation: int | None, fmt: str, exif: bytes | None = None) -> bytes:
    """``a`` encoded as ``fmt`` carrying EXIF Orientation ``orientation`` (or the raw
    EXIF block ``exif``; neither: no EXIF). PNG_LATE puts the eXIf chunk after the
    pixel data, where Pillow finds it only when it decodes."""
    kw: dict = {"lossless": True} if fmt == "WEBP" else {}
    if orientation is not None:
        e = Image.Exif()
        e[ORIENTATION] = orientation
        kw["exif"] = e
    elif exif is not None:
        kw["exif"] = exif
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG" if fmt == "PNG_LATE" else fmt, **kw)
    data = buf.getvalue()
    if fmt == "PNG_LATE":
        chunks, i = [], 8
        while i < len(data):
            n = int.from_bytes(data[i : i + 4], "big")
            chunks.append(data[i : i + 12 + n])
            i += 12 + n
        exif_chunk = [c for c in chunks if c[4:8] == b"eXIf"]
        rest = [c for c in chunks if c[4:8] != b"eXIf"]
        data = data[:8] + b"".join(rest[:-1] + exif_chunk + rest[-1:])  # before IEND
    return data


def _pillow(data: bytes, mode: str = "RGB", *, transpose: bool = False,
            size: tuple[int, int] | None = None, draft: tuple[int, int] | None = None) -> np.ndarray:
    """What Pillow itself gives: open, [draft], [exif_transpose], convert, [resize]."""
    from PIL import ImageOps

    img = Image.open(io.BytesIO(data))
    if draft is not None:
        img.draft(None, draft)
    if transpose:
        img = ImageOps.exif_transpose(img)
    img = img.convert(mode)
    if size is not None:
        img = img.resize(size, Image.Resampling.BILINEAR)
    arr = np.asarray(img)
    return arr if arr.ndim == 3 else arr[:, :, None]


def _orientation_table(fmt: str, h: int = 6, w: int = 9) -> tuple[pa.Table, np.ndarray]:
    """One row per orientation 1-8 of the same non-square image."""
    a = _pixels(h, w, 7)
    data = [_oriented(a, o, fmt) for o in range(1, 9)]
    return pa.table({
        "image": pa.array(data, pa.binary()),
        PROVENANCE_FILE: ["imgs/part-0.parquet"] * 8,
        PROVENANCE_ROW: pa.array(range(8), pa.int64()),
    }), a


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "PNG_LATE", "WEBP"])
def test_exif_orientation_ignore_keeps_stored_layout_and_apply_equals_exif_transpose(fmt):
    """Without a size (the variable layout): "ignore" gives the stored layout (as
    before the option), "apply" exactly ImageOps.exif_transpose's pixels, for all 8
    orientations; for lossless formats that is the EXIF meaning of each tag."""
    tbl, a = _orientation_table(fmt)
    data = tbl.column("image").to_pylist()
    modes = ("RGB", "L") if fmt == "PNG" else ("RGB",)
    for mode in modes:
        default = read_images(DecodeImage(mode=mode)(tbl).column("image"))[0]
        ignored = read_images(DecodeImage(mode=mode, exif_orientation="ignore")(tbl).column("image"))[0]
        applied, valid = read_images(DecodeImage(mode=mode, exif_orientation="apply")(tbl).column("image"))
        assert valid.all()
        for o, d, dflt, ign, app in zip(range(1, 9), data, default, ignored, applied):
            np.testing.assert_array_equal(dflt, ign)
            np.testing.assert_array_equal(ign, _pillow(d, mode), err_msg=f"ignore {fmt} {o}")
            assert ign.shape[:2] == a.shape[:2]
            np.testing.assert_array_equal(app, _pillow(d, mode, transpose=True), err_msg=f"apply {fmt} {o}")
            assert app.shape[:2] == (a.shape[:2] if o <= 4 else a.shape[1::-1])
            if fmt != "JPEG" and mode == "RGB":
                np.testing.assert_array_equal(app, _DISPLAYED[o](a), err_msg=f"{fmt} {o}")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "PNG_LATE", "WEBP"])
def test_exif_orientation_apply_turns_before_the_resize_of_a_sized_decode(fmt):
    """With height/width (draft off: a full-size decode): the image is turned, then
    resized, so (height, width) is the output's shape for every orientation; "apply"
    equals exif_transpose + resize exactly and equals DecodeImage(apply) then Resize."""
    tbl, _ = _orientation_table(fmt)
    data = tbl.column("image").to_pylist()
    for (h, w), (setting, transpose) in itertools.product(
        ((4, 7), (5, 3)), (("ignore", False), ("apply", True))
    ):
        dec = DecodeImage(height=h, width=w, draft=False, exif_orientation=setting)
        out = dec(tbl)
        assert out.schema == dec.output_schema(tbl.schema)
        images, valid = read_images(out.column("image"))
        assert valid.all() and images.shape == (8, h, w, 3)
        for o, d, im in zip(range(1, 9), data, images):
            np.testing.assert_array_equal(im, _pillow(d, transpose=transpose, size=(w, h)),
                                          err_msg=f"{setting} {fmt} {o}")
        two = Resize(height=h, width=w)(DecodeImage(exif_orientation=setting)(tbl))
        assert out.column("image").equals(two.column("image"))


def test_exif_orientation_apply_with_draft_scales_the_stored_layout_to_the_turned_target():
    """A JPEG at least twice the target is decoded at reduced scale (draft). Its
    stored layout is scaled toward the target turned back (a 90-degree orientation
    swaps height and width), never below it; then turned, then resized: the output is
    (height, width) and within the draft tolerance of a full-size decode."""
    h, w = 96, 160  # stored; orientations 5-8 display it 160 high, 96 wide
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1).astype(np.uint8)
    data = [_oriented(a, o, "JPEG") for o in range(1, 9)]
    tbl = pa.table({"image": pa.array(data, pa.binary())})
    for oh, ow in ((40, 24), (24, 40)):  # a portrait and a landscape target
        fast = read_images(DecodeImage(height=oh, width=ow, exif_orientation="apply")(tbl).column("image"))[0]
        full = read_images(DecodeImage(height=oh, width=ow, draft=False,
                                       exif_orientation="apply")(tbl).column("image"))[0]
        assert fast.shape == full.shape == (8, oh, ow, 3)
        for o, d, f, g in zip(range(1, 9), data, fast, full):
            stored = (ow, oh) if o <= 4 else (oh, ow)  # the target in the stored layout (w, h)
            np.testing.assert_array_equal(
                f, _pillow(d, transpose=True, size=(ow, oh), draft=stored), err_msg=f"{oh}x{ow} {o}")
            diff = np.abs(f.astype(int) - g.astype(int))
            assert diff.mean() <= 2.0 and diff.max() <= 16, (o, diff.mean(), diff.max())
    # "ignore" keeps today's draft decode of the stored layout.
    ign = read_images(DecodeImage(height=24, width=40)(tbl).column("image"))[0]
    for d, im in zip(data, ign):
        np.testing.assert_array_equal(im, _pillow(d, size=(40, 24), draft=(40, 24)))


def test_exif_orientation_tiff_is_displayed_by_pillow_in_both_settings():
    """Pillow's TIFF decoder applies a TIFF's own Orientation tag itself: TIFFs came
    out as displayed before the option and still do under both settings (never
    turned twice), equal to exif_transpose."""
    a = _pixels(5, 8, 3)
    data = [_oriented(a, o, "TIFF") for o in range(1, 9)]
    tbl = pa.table({"image": pa.array(data, pa.binary())})
    for setting in ("ignore", "apply"):
        images = read_images(DecodeImage(exif_orientation=setting)(tbl).column("image"))[0]
        sized = read_images(DecodeImage(height=3, width=4, exif_orientation=setting)(tbl).column("image"))[0]
        for o, d, im, s in zip(range(1, 9), data, images, sized):
            np.testing.assert_array_equal(im, _DISPLAYED[o](a), err_msg=f"{setting} {o}")
            np.testing.assert_array_equal(im, _pillow(d, transpose=True))
            np.testing.assert_array_equal(s, _pillow(d, transpose=True, size=(4, 3)))


def test_exif_orientation_from_xmp_follows_pillow():
    """Where the EXIF has no Orientation, Pillow (exif_transpose) reads an XMP
    tiff:Orientation; "apply" does the same."""
    a = _pixels(5, 8, 4)
    xmp = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/'
           b'02/22-rdf-syntax-ns#"><rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" '
           b'tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>')
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", xmp=xmp)
    tbl = pa.table({"image": [buf.getvalue()]})
    im = read_images(DecodeImage(exif_orientation="apply")(tbl).column("image"))[0][0]
    assert im.shape == (8, 5, 3)
    np.testing.assert_array_equal(im, _pillow(buf.getvalue(), transpose=True))


def _exif_block(orientation_entry: bytes | None = None, *, cut: int | None = None) -> bytes:
    """A big-endian EXIF block (``Exif\\0\\0`` + TIFF header + IFD0 with one entry)."""
    entry = orientation_entry or struct.pack(">HHLHH", ORIENTATION, 3, 1, 6, 0)
    block = b"Exif\x00\x00" + b"MM\x00*" + struct.pack(">L", 8) + struct.pack(">H", 1) + entry + b"\0" * 4
    return block if cut is None else block[:cut]


def _malformed_exif_table() -> pa.Table:
    """JPEG rows: unreadable EXIF (not TIFF; IFD0 cut short; IFD0 past the end; an
    Orientation of 9; an Orientation entry of text), then orientation 0, 6 and no EXIF."""
    a = _pixels(6, 9, 5)
    exifs = [
        b"Exif\x00\x00garbage, not a TIFF header",
        _exif_block(cut=6 + 8 + 2 + 6),  # the orientation entry is cut in half
        b"Exif\x00\x00MM\x00*" + struct.pack(">L", 4000) + b"\0" * 8,
        _exif_block(struct.pack(">HHLHH", ORIENTATION, 3, 1, 9, 0)),
        _exif_block(struct.pack(">HHL4s", ORIENTATION, 2, 2, b"6\0\0\0")),
        _exif_block(struct.pack(">HHLHH", ORIENTATION, 3, 1, 0, 0)),  # 0: "unknown" -> as 1
        _exif_block(),  # 6, well-formed
        None,
    ]
    data = [_oriented(a, None, "JPEG", exif=e) for e in exifs]
    return _image_table(data)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow, opening them
def test_malformed_exif_is_a_bad_record_with_apply_and_unread_with_ignore():
    """With "apply", an EXIF block whose Orientation cannot be read (Pillow would
    silently read none) or an Orientation outside 1-8 is a bad record naming the
    column and the problem (the file and row through the bad-record mechanism).
    0, which some writers use for "unknown", reads as 1. With "ignore" the EXIF is
    never read: every row decodes, as before the option."""
    tbl = _malformed_exif_table()
    data = tbl.column("image").to_pylist()
    assert all(Image.open(io.BytesIO(d)).size == (9, 6) for d in data)  # Pillow opens all
    ok, bad = split_errors(DecodeImage()(tbl))
    assert len(bad) == 0 and len(ok) == 8
    for dec in (DecodeImage(exif_orientation="apply"),
                DecodeImage(height=4, width=7, exif_orientation="apply"),
                DecodeImage(height=3, width=4, exif_orientation="apply", draft=True)):
        ok, bad = split_errors(dec(tbl))
        assert ok.column("label").to_pylist() == [5, 6, 7], dec
        assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 1, 2, 3, 4]
        reasons = bad.column(ERROR_COLUMN).to_pylist()
        for r in reasons:
            assert r.startswith("DecodeImage: image in column 'image' (") and "bytes) has an unreadable EXIF orientation" in r, r
            assert "exif_orientation: ignore" in r, r
        assert "does not start with a TIFF header" in reasons[0]
        assert "runs past the end" in reasons[1]
        assert "lies past the end" in reasons[2]
        assert "Orientation is 9; valid: 1-8" in reasons[3]
        assert "type 2 (ASCII), count 2" in reasons[4]
        images = read_images(ok.column("image"))[0]
        if dec.height is None:
            np.testing.assert_array_equal(images[0], _pillow(data[5]))  # 0: as stored
            np.testing.assert_array_equal(images[1], _pillow(data[6], transpose=True))
            np.testing.assert_array_equal(images[2], _pillow(data[7]))
    with pytest.raises(Exception, match=r"bad record at file 'imgs/part-0.parquet' row 0: "
                                        r"DecodeImage: .*unreadable EXIF orientation"):
        apply_transforms(tbl, [DecodeImage(exif_orientation="apply")])


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow, opening them
def test_exif_orientation_decode_then_resize_fuses_bit_identically():
    """DecodeImage(exif_orientation=...) then Resize(h, w) runs as one pass
    (DecodeResize) with the two transforms' values, bad rows and reasons."""
    from slicefeed.transforms import DecodeResize, chain_steps

    tbl = pa.concat_tables([
        _orientation_table("JPEG")[0].append_column("label", pa.array(range(8))),
        _malformed_exif_table().select(["image", PROVENANCE_FILE, PROVENANCE_ROW, "label"]),
    ])
    for setting in ("ignore", "apply"):
        decode, resize = DecodeImage(exif_orientation=setting), Resize(height=5, width=3)
        steps = chain_steps([decode, resize])
        assert isinstance(steps[0].fn, DecodeResize) and steps[0].count == 2
        assert steps[0].fn._fused.exif_orientation == setting
        want, want_bad = _unfused(tbl, decode, resize)
        got, got_bad = split_errors(steps[0].fn(tbl))
        assert got.schema == want.schema
        assert got.column("image").equals(want.column("image")), setting
        assert len(got_bad) == len(want_bad) == (0 if setting == "ignore" else 5)
        if len(got_bad):
            assert got_bad.column(ERROR_COLUMN).to_pylist() == want_bad.column(ERROR_COLUMN).to_pylist()


def test_exif_orientation_option_is_checked_and_written_only_when_set():
    with pytest.raises(SpecError, match=r"DecodeImage: unknown exif_orientation 'auto'; allowed: ignore, apply"):
        DecodeImage(exif_orientation="auto")
    with pytest.raises(SpecError, match=r"DecodeImage: argument 'exif_orientation' must be a string; got True"):
        DecodeImage(exif_orientation=True)
    # The default is not written: existing specs, their fingerprints and outputs stay.
    assert DecodeImage().to_spec() == {"decode_image": {}}
    assert DecodeImage(exif_orientation="apply").to_spec() == {"decode_image": {"exif_orientation": "apply"}}
