"""Image transforms: decode, resize, crop, flip, normalise.

Two column layouts carry images between transforms:

- **variable** (after :class:`DecodeImage`, or a shorter-side :class:`Resize`):
  ``struct<height: int32, width: int32, pixels: list<fixed_size_list<uint8>[C]>>``
  (HWC, row-major; C, the channel count, is part of the type).
- **fixed** (after an exact :class:`Resize`, a crop, or :class:`NormalizeImage`):
  ``arrow.fixed_shape_tensor`` of ``T`` with shape ``(H, W, C)``, a static HWC
  shape in the type; a batch's values buffer is one dense ``(B, H, W, C)``
  array (zero-copy ``reshape``), and Ray Data reads it as that array. ``T`` is
  uint8, float32, or uint16 holding bfloat16 bits (field metadata
  ``slicefeed.dtype: bfloat16``). The nested
  ``fixed_size_list<fixed_size_list<fixed_size_list<T>[C]>[W]>[H]`` layout
  written before is read as the same fixed layout.

Decoding and resampling call Pillow once per image (images differ in size);
crops, flips and normalisation of fixed-size images are vectorised NumPy.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import posixpath
import re
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW, printable, short_repr
from slicefeed.transforms._arrays import fixed_values, is_tensor, make_tensor, tensor_type
from slicefeed.transforms._badrecords import mark_errors
from slicefeed.transforms._contract import Transform
from slicefeed.transforms._dtypes import bfloat16_field, to_bfloat16_bits
from slicefeed.transforms._hashing import row_keys, row_uniform, seeded_copy

MODES = {"RGB": 3, "L": 1, "RGBA": 4}
RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos", "box")
IMAGE_DTYPES = ("uint8", "float32", "bfloat16")
#: ``DecodeImage(exif_orientation=...)``: decode the stored pixel layout, or turn
#: each image as it is displayed.
EXIF_ORIENTATIONS = ("ignore", "apply")


def variable_type(channels: int) -> pa.DataType:
    """Arrow type of a variable-size image column with ``channels`` channels."""
    return pa.struct(
        [
            pa.field("height", pa.int32()),
            pa.field("width", pa.int32()),
            pa.field("pixels", pa.list_(pa.list_(pa.uint8(), channels))),
        ]
    )


def fixed_type(h: int, w: int, c: int, value_type: pa.DataType | None = None) -> pa.DataType:
    """Arrow type of a fixed ``(h, w, c)`` image column (uint8 unless ``value_type``)."""
    return tensor_type(value_type or pa.uint8(), (h, w, c))


def image_layout(t: pa.DataType) -> tuple[str, tuple[int, ...] | None, int, pa.DataType] | None:
    """``(layout, (h, w) or None, channels, value type)`` of an image column type."""
    if pa.types.is_struct(t) and [f.name for f in t] == ["height", "width", "pixels"]:
        px = t.field("pixels").type
        if pa.types.is_list(px) and pa.types.is_fixed_size_list(px.value_type):
            return "variable", None, px.value_type.list_size, px.value_type.value_type
    if is_tensor(t) and len(t.shape) == 3:
        h, w, c = t.shape
        return "fixed", (h, w), c, t.value_type
    if (
        pa.types.is_fixed_size_list(t)
        and pa.types.is_fixed_size_list(t.value_type)
        and pa.types.is_fixed_size_list(t.value_type.value_type)
    ):
        h, w, c = t.list_size, t.value_type.list_size, t.value_type.value_type.list_size
        return "fixed", (h, w), c, t.value_type.value_type.value_type
    return None


def read_images(col: pa.Array | pa.ChunkedArray) -> tuple[Any, np.ndarray]:
    """``(images, valid)``: a dense ``(B, H, W, C)`` array for the fixed layout
    (a view where possible), or a list of ``(h, w, c)`` views for variable."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    layout = image_layout(col.type)
    n = len(col)
    valid = np.ones(n, bool) if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    if layout is None:
        raise TypeError(f"not an image column: {col.type}")
    kind, hw, c, _ = layout
    if kind == "fixed":
        h, w = hw
        flat = fixed_values(col)
        return flat.to_numpy(zero_copy_only=False).reshape(n, h, w, c), valid
    hs = col.field("height").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    ws = col.field("width").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    px = col.field("pixels")
    offs = px.offsets.to_numpy().astype(np.int64)
    values = px.values.flatten().to_numpy(zero_copy_only=False)
    images = []
    for i in range(n):
        if not valid[i]:
            images.append(None)
            continue
        a, b = offs[i] * c, offs[i + 1] * c
        images.append(values[a:b].reshape(hs[i], ws[i], c))
    return images, valid


def write_variable(images: Sequence[np.ndarray | None], channels: int) -> pa.Array:
    """A variable-layout column from ``(h, w, c)`` uint8 arrays (None -> null)."""
    hs = np.array([0 if im is None else im.shape[0] for im in images], np.int32)
    ws = np.array([0 if im is None else im.shape[1] for im in images], np.int32)
    valid = np.array([im is not None for im in images], bool)
    npx = hs.astype(np.int64) * ws
    offsets = np.concatenate([[0], np.cumsum(npx)]).astype(np.int32)
    parts = [im.reshape(-1) for im in images if im is not None]
    values = np.concatenate(parts).astype(np.uint8) if parts else np.zeros(0, np.uint8)
    pixels = pa.ListArray.from_arrays(
        pa.array(offsets), pa.FixedSizeListArray.from_arrays(pa.array(values), channels)
    )
    mask = None if valid.all() else pa.array(~valid)
    return pa.StructArray.from_arrays(
        [pa.array(hs), pa.array(ws), pixels],
        fields=list(variable_type(channels)),
        mask=mask,
    )


def write_fixed(images: np.ndarray, valid: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """A fixed-layout column from a dense ``(B, H, W, C)`` array."""
    return make_tensor(images, images.shape[1:], valid, value_type)


def _set(table: pa.Table, name: str, arr: pa.Array, field: pa.Field | None = None) -> pa.Table:
    field = field or pa.field(name, arr.type)
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), field, arr)
    return table.append_column(field, arr)


def _set_schema(schema: pa.Schema, field: pa.Field) -> pa.Schema:
    if field.name in schema.names:
        return schema.set(schema.get_field_index(field.name), field)
    return schema.append(field)


class _ImageTransform(Transform):
    """Shared checks for transforms that take an image column."""

    column: str

    def _layout(self, schema: pa.Schema):
        t = self._require(schema, self.column)
        layout = image_layout(t)
        if layout is None or layout[3] != pa.uint8():
            raise self._spec_error(
                f"column {short_repr(self.column)} has type {t}; expected a uint8 image column "
                "(add DecodeImage first; NormalizeImage must come last)"
            )
        return layout

    @property
    def out(self) -> str:
        return getattr(self, "output", None) or self.column


def _pos_int(self: Transform, **kw: Any) -> None:
    for k, v in kw.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise self._spec_error(f"{k} must be a positive integer; got {short_repr(v)}")


#: Default ``max_pixels``: well under Pillow's own bomb limit (about 178 MP).
DEFAULT_MAX_PIXELS = 64_000_000
#: Default ``max_batch_bytes``: decoded images a batch may hold at once.
DEFAULT_MAX_BATCH_BYTES = 2 << 30

# A URI scheme (``http:``, ``file:/``, ``gs://``) at the start of a path.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:/")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _show(value: str) -> str:
    """``repr`` of user data for messages: control characters escaped, truncated."""
    return short_repr(value, 120)


def _relative_key(path: str) -> str | None:
    """The normalised form of ``path`` if it names a file under a root, else None."""
    if path.startswith(("/", "\\")) or _SCHEME.match(path):
        return None
    key = posixpath.normpath(path)
    if key in (".", "..") or key.startswith("../"):
        return None
    return key


@dataclasses.dataclass(frozen=True)
class DecodeImage(_ImageTransform):
    """Decodes JPEG/PNG (any Pillow format) into the variable image layout.

    The input is encoded bytes (binary column) or file paths (string column).
    Paths are relative to ``root``, which is required for a path column, and are
    read from ``root``'s filesystem with the storage options given by
    :meth:`with_storage` (a pipeline gives the source's: ``root`` must be on a
    source's filesystem). A path that is absolute, carries a scheme
    (``http://``, ``file://``, ``gs://``), climbs out of ``root`` with ``..``,
    or (on local disk) is a symlink leading out of ``root`` is a bad record and
    is never read.

    Limits (each a bad record naming the row, never an exception): an image
    whose header declares more than ``max_pixels`` pixels is refused before it
    is decoded; the decoded images a batch holds at once are bounded by
    ``max_batch_bytes`` (width x height x channels of each full-size decode).
    Without ``height``/``width`` the decoded images are the output, so rows
    are admitted in row order while they fit and the rest are bad records
    (lower the batch size or resize while decoding); with them only the
    decodes in flight count, and a row is refused only if its own decode is
    larger than the bound.

    An image that cannot be read or decoded marks its row bad. 16-bit
    greyscale images (16-bit PNG/TIFF, Pillow mode ``I;16``) are scaled to 8
    bits by their high byte (``v >> 8``, as Pillow reads 16-bit RGB), not
    clamped at 255; 32-bit integer (``I``), signed 16-bit and float (``F``)
    images have no standard range and are bad records naming the mode.

    EXIF orientation (``exif_orientation``): cameras store the sensor's pixel
    layout and an EXIF Orientation tag (1-8; 6: turn 90 degrees clockwise to
    display). ``ignore`` (the default, and the decode before the option
    existed; like ``tf.io.decode_jpeg``, Grain and torchvision's default)
    decodes the stored layout and never reads the EXIF. ``apply`` turns each
    image as it is displayed, the pixels Pillow's ``ImageOps.exif_transpose``
    gives (the tag from the EXIF block of a JPEG, PNG or WebP; where that has
    none, an XMP ``tiff:Orientation``, as Pillow reads it), before the resize:
    ``height``/``width`` are the output's shape whatever the orientation (with
    ``draft``, the stored JPEG is scaled toward the target turned back, never
    below it). Under ``apply`` an Orientation that cannot be read is a bad
    record naming the problem: an EXIF block that is not a TIFF structure or
    whose first directory (IFD0) runs past its end, an Orientation entry that
    is not one integer, or a value outside 1-8; 0, which some writers use for
    "unknown", and no tag read as 1 (the stored layout). TIFFs: Pillow's TIFF
    decoder applies a TIFF's own Orientation tag itself, so TIFFs are decoded
    as displayed under both settings (as they were before the option).

    Args:
        column: Input column (binary, or string paths relative to ``root``).
        output: Output column (default: replace ``column``).
        mode: Pillow mode to convert to: ``RGB`` (3 channels), ``L`` (1), ``RGBA`` (4).
        root: Directory or URI prefix (``gs://bucket/images``) that paths are
            relative to; required for a string column.
        height: With ``width``: resize while decoding (one Pillow pass, no
            intermediate copy) and output the fixed layout, like
            ``Resize(height, width)`` after ``DecodeImage()`` (a pipeline or
            ``apply_transforms`` runs that pair as one such pass itself, with
            ``draft`` off: see :func:`chain_steps`), and with ``draft`` faster
            still on large JPEGs (benchmarks/transforms.py, image_decode_resize).
        width: See ``height``.
        resample: Filter for that resize (see :class:`Resize`).
        max_pixels: Largest width x height accepted (from the image header).
        max_batch_bytes: Bound on the decoded bytes a batch holds at once.
        draft: With ``height``/``width``, let the JPEG decoder scale down by
            1/2, 1/4 or 1/8 (never below the target size) before the resize.
            Much faster on large JPEGs; pixels differ from a full-size decode
            plus resize by a few levels (benchmarks/README.md states the
            measured difference). ``false`` gives Pillow's full-size result.
        threads: Images decoded concurrently (Pillow releases the GIL while
            decoding and resampling); default: the CPUs this process may use,
            at most 8 (inside a Ray task: the CPUs Ray assigned to it).
        exif_orientation: ``ignore`` (default): the stored pixel layout;
            ``apply``: turned as displayed (see above). It changes pixel
            values, so it is part of the pipeline fingerprint when set.
    """

    name: ClassVar[str] = "decode_image"
    column: str = "image"
    output: str | None = None
    mode: str = "RGB"
    root: str | None = None
    height: int | None = None
    width: int | None = None
    resample: str = "bilinear"
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    draft: bool = True
    threads: int | None = None
    exif_orientation: str = "ignore"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise self._spec_error(f"unknown mode {short_repr(self.mode)}; allowed: {', '.join(MODES)}")
        _pos_int(self, height=self.height, width=self.width, max_pixels=self.max_pixels,
                 max_batch_bytes=self.max_batch_bytes, threads=self.threads)
        if (self.height is None) != (self.width is None):
            raise self._spec_error("give both height and width to resize while decoding, or neither")
        if self.resample not in RESAMPLE:
            raise self._spec_error(
                f"unknown resample {short_repr(self.resample)}; allowed: {', '.join(RESAMPLE)}"
            )
        if self.exif_orientation not in EXIF_ORIENTATIONS:
            raise self._spec_error(
                f"unknown exif_orientation {short_repr(self.exif_orientation)}; allowed: "
                f"{', '.join(EXIF_ORIENTATIONS)}"
            )
        if self.root is not None and (not isinstance(self.root, str) or not self.root):
            raise self._spec_error(f"root must be a directory path or URI; got {short_repr(self.root)}")

    # -- storage ---------------------------------------------------------------

    def with_storage(self, **storage: Any) -> DecodeImage:
        """A copy that reads ``root`` with these storage options.

        ``credentials``, ``anonymous``, ``project`` (as for a source's
        ``storage:``). They stay out of :meth:`to_spec`, ``repr`` and equality.
        """
        new = dataclasses.replace(self)
        object.__setattr__(new, "_storage", dict(storage))
        return new

    @property
    def storage(self) -> dict[str, Any]:
        """Storage options ``root`` is read with (see :meth:`with_storage`)."""
        return dict(getattr(self, "_storage", {}))

    def with_source_storage(self, sources: Sequence[tuple[str, dict[str, Any]]]) -> DecodeImage:
        """Binds ``root`` to the filesystem and storage options of a source.

        Args:
            sources: ``(uri, storage options)`` of each pipeline source.

        Raises:
            SpecError: if no source is on ``root``'s filesystem.
        """
        if self.root is None:
            return self
        proto = _protocol(self.root)
        same = [(u, st) for u, st in sources if _protocol(u) == proto]
        if not same:
            have = ", ".join(sorted({_protocol(u) for u, _ in sources}))
            raise self._spec_error(
                f"root {printable(self.root, 200)} is not on the source's filesystem ({have}); images are "
                "read with the source's storage credentials, so keep them on the source's "
                "filesystem (or in the same bucket)"
            )
        if proto == "gs":  # prefer a source in the same bucket
            bucket = _bucket(self.root)
            same.sort(key=lambda us: _bucket(us[0]) != bucket)
        return self.with_storage(**same[0][1])

    def folders_read(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """``root`` (paths in the column are read under it), with its storage options."""
        return () if self.root is None else ((self.root, self.storage),)

    def _root(self):
        """``(fs, root path, real local root or None)`` of ``root``."""
        from slicefeed.connectors import resolve_filesystem

        r = resolve_filesystem(self.root, **getattr(self, "_storage", {}))
        real = None
        if r.protocol == "file":  # symlinks must not lead out: compare real paths
            real = os.path.join(os.path.realpath(r.path), "")
        return r.fs, r.path.rstrip("/"), real

    # -- schema ----------------------------------------------------------------

    @property
    def _fixed(self) -> bool:
        return self.height is not None

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._require(schema, self.column, kinds=("binary", "string"))
        if self.root is None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise self._spec_error(
                f"column {short_repr(self.column)} holds paths; set root (the directory or gs:// "
                "prefix they are relative to). Paths outside it are not read."
            )
        c = MODES[self.mode]
        t = fixed_type(self.height, self.width, c) if self._fixed else variable_type(c)
        return _set_schema(schema, pa.field(self.out, t))

    # -- decoding --------------------------------------------------------------

    def _read(self, item: str, root) -> bytes:
        """Bytes of ``item`` under ``root``; raises ``_Refused`` outside it."""
        if root is None:
            raise _Refused("cannot be read: no root is declared for the path column")
        if not item:
            raise _Refused("is empty")
        if _CONTROL.search(item):
            raise _Refused("contains a control character")
        key = _relative_key(item)
        fs, base, real = root
        if key is None:
            kind = "outside the root" if ".." in item.split("/") else "not a path relative to the root"
            raise _Refused(f"is {kind} {printable(self.root, 200)}")
        path = f"{base}/{key}"
        if real is not None:
            resolved = os.path.realpath(path)
            if not resolved.startswith(real) or resolved == real.rstrip(os.sep):
                raise _Refused(f"resolves outside the root {printable(self.root, 200)} (a symlink)")
            path = resolved
        return fs.cat_file(path)

    def _open(self, item: Any, is_path: bool, root):
        """Fetches and opens (header only) one image; ``(image, reason)``."""
        from PIL import Image

        if item is None:
            return None, f"DecodeImage: column {short_repr(self.column)} is null"
        what = f"path {_show(item)}" if is_path else f"{len(item)} bytes"
        try:
            data = self._read(item, root) if is_path else item
            img = Image.open(io.BytesIO(data))
        except _Refused as e:
            return None, f"DecodeImage: {what} in column {short_repr(self.column)} {e}"
        except Exception as e:  # noqa: BLE001 - any read/codec failure is a bad record
            return None, _decode_reason(self.column, what, e)
        w, h = img.size
        if w * h > self.max_pixels:
            img.close()
            return None, (
                f"DecodeImage: image in column {short_repr(self.column)} ({what}) is {w}x{h} "
                f"({w * h:,} pixels), over max_pixels={self.max_pixels:,}; raise max_pixels "
                "if such images are expected"
            )
        why = _sample_refusal(img)
        if why is not None:
            img.close()
            return None, (
                f"DecodeImage: image in column {short_repr(self.column)} ({what}) has Pillow mode "
                f"{short_repr(img.mode)} ({why}), which has no standard range to scale to 8 bits; "
                "convert such images to 8- or 16-bit (scaled to the range they use) first"
            )
        return img, None

    def _decode(self, img, out: np.ndarray | None, i: int) -> np.ndarray | None:
        """Decodes ``img``; writes row ``i`` of ``out`` (fixed layout) or returns it.

        With ``exif_orientation="apply"`` the decoded, converted image is turned
        as displayed before any resize (raises :class:`_BadOrientation`)."""
        src = img  # the opened file: its EXIF and XMP
        unread = self.exif_orientation == "apply"  # the orientation is still to be read
        turn: int | None = None
        if self._fixed:
            size = (self.width, self.height)
            if self.draft and img.format == "JPEG":
                stored = size  # the target in the stored layout
                if unread:  # a JPEG's EXIF is in its header: read before decoding
                    turn, unread = _exif_turn(src), False
                    if turn in _SWAPS_AXES:
                        stored = (self.height, self.width)
                if min(img.size[0] // stored[0], img.size[1] // stored[1]) >= 2:
                    img.draft(None, stored)  # scale only: libjpeg's 1/2, 1/4, 1/8, >= stored
            if img.mode != self.mode:
                img = _convert(img, self.mode)
            if unread:
                src.load()  # as exif_transpose: a PNG's eXIf may follow the pixels
                turn = _exif_turn(src)
            if turn is not None:
                img = img.transpose(turn)
            if img.size != size:
                img = img.resize(size, _PIL_RESAMPLE[self.resample])
            arr = np.asarray(img)
            out[i] = arr if arr.ndim == 3 else arr[:, :, None]
            return None
        if img.mode != self.mode:
            img = _convert(img, self.mode)
        else:
            img.load()
        if unread:
            src.load()
            turn = _exif_turn(src)
            if turn is not None:
                img = img.transpose(turn)
        arr = np.asarray(img)
        return arr if arr.ndim == 3 else arr[:, :, None]

    def _too_big(self, img, total: int) -> str:
        img.close()
        return self._too_big_reason(img.size, total)

    def _too_big_reason(self, size: tuple[int, int], total: int) -> str:
        return (
            f"DecodeImage: decoding this {size[0]}x{size[1]} image in column "
            f"{short_repr(self.column)} would bring the batch's decoded images to {total:,} bytes, "
            f"over max_batch_bytes={self.max_batch_bytes:,}; use smaller batches, resize "
            "while decoding (height/width), or raise max_batch_bytes"
        )

    def __call__(self, table: pa.Table) -> pa.Table:
        return self._decode_table(table, admit_in_order=not self._fixed)

    def _decode_table(self, table: pa.Table, *, admit_in_order: bool) -> pa.Table:
        """The batch decoded. ``admit_in_order``: rows are admitted in row order
        while the batch's full-size decodes fit ``max_batch_bytes`` and the rest
        are bad records (the variable layout's rule; with ``height``/``width``
        it refuses the very rows ``DecodeImage()`` would, for
        :class:`DecodeResize`); otherwise only decodes in flight count (and
        only an image larger than the bound alone is refused)."""
        col = table.column(self.column)
        is_path = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
        items = col.to_pylist()
        n = len(items)
        c = MODES[self.mode]
        root = self._root() if is_path and self.root is not None else None
        pool = _pool(self.threads)
        budget = _Budget(self.max_batch_bytes)
        reasons = np.empty(n, dtype=object)

        def what(i: int) -> str:
            return f"path {_show(items[i])}" if is_path else f"{len(items[i])} bytes"

        def decode(i: int, img, need: int, out: np.ndarray | None):
            """Decodes one opened image under the budget; ``(array, reason)``."""
            budget.acquire(need)
            try:
                with img:
                    return self._decode(img, out, i), None
            except _BadOrientation as e:
                return None, (
                    f"DecodeImage: image in column {short_repr(self.column)} ({what(i)}) has an "
                    f"unreadable EXIF orientation ({e}); exif_orientation='apply' needs it to turn "
                    "the image as displayed: fix or strip the image's EXIF, or decode the stored "
                    "layout with exif_orientation: ignore"
                )
            except Exception as e:  # noqa: BLE001 - any codec failure is a bad record
                return None, _decode_reason(self.column, what(i), e)
            finally:
                if out is not None:  # the variable layout keeps what it decoded
                    budget.release(need)

        if self._fixed:
            # Rows are independent (only decodes in flight count against the
            # bound): open, check and decode each row in one task.
            out = np.zeros((n, self.height, self.width, c), np.uint8)
            sizes: list[tuple[int, int] | None] = [None] * n  # of each opened image

            def row(i: int) -> str | None:
                img, why = self._open(items[i], is_path, root)
                if img is None:
                    return why
                sizes[i] = img.size
                need = img.size[0] * img.size[1] * c
                if need > self.max_batch_bytes:
                    return self._too_big(img, need)
                return decode(i, img, need, out)[1]

            reasons[:] = _map_chunked(pool, row, range(n))
            if admit_in_order:
                # DecodeImage()'s rule, applied once all rows are done: in row
                # order, an opened image is refused if the full-size decodes
                # admitted before it plus its own pass the bound (it was
                # decoded here, within the in-flight bound, and is dropped).
                held = 0
                for i, size in enumerate(sizes):
                    if size is None:
                        continue
                    need = size[0] * size[1] * c
                    if held + need > self.max_batch_bytes:
                        reasons[i] = self._too_big_reason(size, held + need)
                    else:
                        held += need
            bad = np.array([r is not None for r in reasons], bool)
            if bad.any():
                out[bad] = 0
            table = _set(table, self.out, write_fixed(out, ~bad, pa.uint8()))
            return mark_errors(table, bad, reasons)

        # Variable layout: the decoded images are the output. Headers first, then
        # rows admitted in row order while the batch's decoded bytes fit.
        # Headers of in-memory bytes are parsed in Python (GIL-bound): no pool.
        opener = pool if is_path else _INLINE
        opened = list(opener.map(lambda item: self._open(item, is_path, root), items))
        reasons[:] = [r for _, r in opened]
        needs = [0] * n
        todo = []
        held = 0
        for i, (img, _) in enumerate(opened):
            if img is None:
                continue
            needs[i] = img.size[0] * img.size[1] * c
            if held + needs[i] > self.max_batch_bytes:
                reasons[i] = self._too_big(img, held + needs[i])
            else:
                held += needs[i]
                todo.append(i)
        images: list[np.ndarray | None] = [None] * n
        done = _map_chunked(pool, lambda i: decode(i, opened[i][0], needs[i], None), todo)
        for i, (arr, why) in zip(todo, done):
            images[i] = arr
            reasons[i] = why
        bad = np.array([r is not None for r in reasons], bool)
        table = _set(table, self.out, write_variable(images, c))
        return mark_errors(table, bad, reasons)


class DecodeResize:
    """``DecodeImage()`` then ``Resize(height, width)`` of its output, run as one
    Pillow pass per image (no decoded full-size batch, no second pass): the
    values, schema, bad records and their reasons are exactly the two
    transforms' (full-size decode, never ``draft``; rows refused by the
    ``max_batch_bytes`` rule of ``DecodeImage()``, in row order). Built by
    :func:`chain_steps` only where that holds; picklable."""

    def __init__(self, decode: DecodeImage, resize: Resize):
        self.decode, self.resize = decode, resize
        fused = dataclasses.replace(decode, height=resize.height, width=resize.width,
                                    resample=resize.resample, draft=False)
        if getattr(decode, "_storage", None) is not None:
            object.__setattr__(fused, "_storage", dict(decode._storage))
        self._fused = fused

    @staticmethod
    def applies(first: Any, second: Any) -> bool:
        """Whether ``first`` then ``second`` may run as one pass: a ``DecodeImage``
        without a size, then an exact-size ``Resize`` of the column it writes
        (in place, so no later transform can read the full-size images)."""
        return (
            type(first) is DecodeImage
            and first.height is None
            and type(second) is Resize
            and second.shorter_side is None
            and second.column == first.out
        )

    def __call__(self, table: pa.Table) -> pa.Table:
        return self._fused._decode_table(table, admit_in_order=True)

    def __repr__(self) -> str:
        return f"DecodeResize({short_repr(self.decode)}, {short_repr(self.resize)})"


# Pillow modes of 16-bit unsigned greyscale samples.
_MODES_16 = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _rawmode(img) -> str:
    """The decoder's raw sample layout of an opened (not yet loaded) image."""
    tile = getattr(img, "tile", None) or []
    if not tile:
        return ""
    args = tile[0][3]
    return args if isinstance(args, str) else (args[0] if args and isinstance(args[0], str) else "")


def _sample_refusal(img) -> str | None:
    """Why an opened image's samples cannot be scaled to 8 bits, or None.

    8-bit modes, and 16-bit unsigned greyscale (``I;16*``, or ``I`` holding
    16-bit unsigned samples, as some Pillow versions open 16-bit PNGs) are
    decoded; 32-bit integer (``I``), signed 16-bit and float (``F``) samples
    have no standard range (the data's own, a sensor's, ...): refused."""
    if img.mode == "F":
        return "32-bit float samples"
    if img.mode == "I":
        raw = _rawmode(img)
        if not raw.startswith("I;16"):
            return "32-bit integer samples"
        if "S" in raw[4:]:
            return "signed 16-bit samples"
    return None


def _convert(img, mode: str):
    """``img`` converted to ``mode``. Pillow's ``convert`` clamps 16-bit samples
    at 255, so 16-bit greyscale is first scaled to 8 bits by its high byte
    (``v >> 8``, the byte Pillow keeps of 16-bit RGB samples), vectorised on
    the array. Only images :func:`_sample_refusal` passes reach here: mode ``I``
    holds 16-bit unsigned samples."""
    from PIL import Image

    if img.mode in _MODES_16 or img.mode == "I":
        img = Image.fromarray((np.asarray(img) >> 8).astype(np.uint8))
        if mode == "L":
            return img
    return img.convert(mode)


class _Refused(Exception):
    """A path that must not be read (outside the root, a URI, ...)."""


class _BadOrientation(Exception):
    """An image whose EXIF orientation cannot be read (``exif_orientation="apply"``)."""


_ORIENTATION = 0x0112  # the EXIF (and TIFF) Orientation tag
# The transposition that displays each orientation: ImageOps.exif_transpose's table
# (Image.Transpose values: FLIP_LEFT_RIGHT, ROTATE_180, FLIP_TOP_BOTTOM, TRANSPOSE,
# ROTATE_270, TRANSVERSE, ROTATE_90).
_TRANSPOSE = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}
# Transpositions that swap width and height (orientations 5-8).
_SWAPS_AXES = frozenset({_TRANSPOSE[o] for o in (5, 6, 7, 8)})
# TIFF field types an Orientation may be written in (one integer), and their layout.
_INT_FIELDS = {1: "B", 3: "H", 4: "L", 6: "b", 8: "h", 9: "l"}
_FIELD_NAMES = {1: "BYTE", 2: "ASCII", 3: "SHORT", 4: "LONG", 5: "RATIONAL", 6: "SBYTE",
                7: "UNDEFINED", 8: "SSHORT", 9: "SLONG", 10: "SRATIONAL", 11: "FLOAT",
                12: "DOUBLE"}
_EXIF_PREFIX = re.compile(rb"^(Exif\x00\x00){1,2}")  # stripped as Pillow strips it


def _exif_turn(img) -> int | None:
    """The ``Image.Transpose`` that displays ``img``, or None (orientation 1).

    Reads what :func:`PIL.ImageOps.exif_transpose` reads (call it on a loaded
    image, except a JPEG, whose EXIF is in its header), strictly: Pillow reads
    an unreadable EXIF block as no tags at all, silently, so the block's first
    directory is read here (:func:`_exif_block_orientation`), and Pillow's
    reading is used only where that block has no Orientation (a TIFF's own
    tag, an XMP ``tiff:Orientation``). 0 ("unknown" to some writers) and no
    tag are 1; anything else outside 1-8 raises :class:`_BadOrientation`.
    """
    raw = img.info.get("exif")
    value = _exif_block_orientation(raw) if isinstance(raw, (bytes, bytearray)) and raw else None
    if value is None:
        try:
            value = img.getexif().get(_ORIENTATION)
        except Exception as e:  # noqa: BLE001 - Pillow's parse of a broken block
            raise _BadOrientation(f"Pillow cannot read its EXIF ({type(e).__name__}: "
                                  f"{_CONTROL.sub('?', str(e))[:200]})") from None
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
        raise _BadOrientation(f"its Orientation is {short_repr(value)}; valid: 1-8")
    return _TRANSPOSE.get(value)


def _exif_block_orientation(raw: bytes) -> int | None:
    """The Orientation entry of an EXIF block's first directory (IFD0), or None.

    The block is a TIFF structure (optionally after ``Exif\\0\\0``): byte order
    (``II``/``MM``), 42, the offset of IFD0, then 12-byte entries (tag, field
    type, count, value). Raises :class:`_BadOrientation` where Pillow would
    silently read no tags: not a TIFF header, IFD0 outside the block or cut
    short, or an Orientation entry that is not one integer.
    """
    data = _EXIF_PREFIX.sub(b"", bytes(raw))
    if not data:
        return None
    order = {b"II*\x00": "<", b"MM\x00*": ">"}.get(data[:4])
    if order is None or len(data) < 8:
        raise _BadOrientation(f"the EXIF block does not start with a TIFF header "
                              f"(it starts {data[:8]!r})")
    (ifd,) = struct.unpack_from(order + "L", data, 4)
    if ifd + 2 > len(data):
        raise _BadOrientation(f"the EXIF block's first directory (at byte {ifd}) lies past the "
                              f"end of the block ({len(data)} bytes)")
    (n,) = struct.unpack_from(order + "H", data, ifd)
    if ifd + 2 + 12 * n > len(data):
        raise _BadOrientation(f"the EXIF block's first directory ({n} entries at byte {ifd}) "
                              f"runs past the end of the block ({len(data)} bytes)")
    for k in range(n):
        at = ifd + 2 + 12 * k
        tag, typ, count = struct.unpack_from(order + "HHL", data, at)
        if tag != _ORIENTATION:
            continue
        fmt = _INT_FIELDS.get(typ)
        if fmt is None or count != 1:
            raise _BadOrientation(
                f"its Orientation entry has type {typ} ({_FIELD_NAMES.get(typ, 'unknown')}), "
                f"count {count}; expected one integer"
            )
        return struct.unpack_from(order + fmt, data, at + 8)[0]
    return None


class _Budget:
    """Decoded bytes in flight: ``acquire`` waits while the bound would be passed
    (one acquisition always proceeds when nothing is held)."""

    def __init__(self, cap: int):
        self.cap, self.used = cap, 0
        self.cv = threading.Condition()

    def acquire(self, n: int) -> None:
        with self.cv:
            while self.used and self.used + n > self.cap:
                self.cv.wait()
            self.used += n

    def release(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()


class _Inline:
    """``map`` on the calling thread (one thread: no pool hand-offs)."""

    size = 1
    map = staticmethod(map)


class _Pool:
    """A thread pool of ``size`` threads."""

    def __init__(self, size: int):
        self.size = size
        self._executor = concurrent.futures.ThreadPoolExecutor(
            size, thread_name_prefix="slicefeed-decode"
        )

    def map(self, fn: Any, items: Any) -> Any:
        return self._executor.map(fn, items)


_INLINE = _Inline()
_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()
# A forked child has the pools' objects but not their threads: start afresh.
os.register_at_fork(after_in_child=_POOLS.clear)


def _pool(threads: int | None) -> _Pool | _Inline:
    """A per-process thread pool (one per size), created on first use."""
    if threads is None:
        threads = _cpus()
    if threads == 1:
        return _INLINE
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = _Pool(threads)
        return pool


def _map_chunked(pool: Any, fn: Any, items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` on ``pool``, a few contiguous chunks per thread
    (fewer hand-offs than one task per image; chunks still balance uneven images)."""
    if pool.size == 1 or len(items) < 2:
        return [fn(x) for x in items]
    k = max(1, len(items) // (4 * pool.size))
    chunks = [items[i : i + k] for i in range(0, len(items), k)]
    return [y for part in pool.map(lambda c: [fn(x) for x in c], chunks) for y in part]


def _cpus() -> int:
    """CPUs this process may use, at most 8: inside a Ray task, the CPUs Ray
    assigned to it (Ray already runs one task per CPU); otherwise the affinity set."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except AssertionError:  # Ray's answer in a driver: not a task
            cpus = None
        if cpus:
            return max(1, min(8, int(cpus)))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _decode_reason(column: str, what: str, e: Exception) -> str:
    # Object reprs carry memory addresses; keep reasons reproducible.
    msg = re.sub(r" <[^>]* at 0x[0-9a-fA-F]+>", "", str(e))
    return (
        f"DecodeImage: cannot decode image in column {short_repr(column)} ({what}): "
        f"{type(e).__name__}: {_CONTROL.sub('?', msg)[:300]}"
    )


def _protocol(uri: str) -> str:
    if "://" not in uri:
        return "file"
    p = uri.split("://", 1)[0].lower()
    return "gs" if p == "gcs" else p


def _bucket(uri: str) -> str:
    return uri.split("://", 1)[-1].split("/", 1)[0]


_PIL_RESAMPLE = {
    "nearest": 0,
    "lanczos": 1,
    "bilinear": 2,
    "bicubic": 3,
    "box": 4,
}


def _pil_resize(im: np.ndarray, w: int, h: int, resample: str) -> np.ndarray:
    from PIL import Image

    if im.shape[0] == h and im.shape[1] == w:
        return im
    c = im.shape[2]
    # fromarray copies a non-contiguous view itself; a contiguous one is read in place.
    src = Image.fromarray(im[:, :, 0] if c == 1 else im)
    out = np.asarray(src.resize((w, h), _PIL_RESAMPLE[resample]))
    return out[:, :, None] if out.ndim == 2 else out


@dataclasses.dataclass(frozen=True)
class Resize(_ImageTransform):
    """Resizes images with Pillow.

    Give ``height`` and ``width`` for an exact size (output: fixed layout), or
    ``shorter_side`` to scale keeping the aspect ratio (output: variable layout;
    follow with a crop for a fixed shape).

    Args:
        column: Image column.
        height: Output height. width: Output width.
        shorter_side: Target length of the shorter side.
        resample: ``nearest``, ``bilinear``, ``bicubic``, ``lanczos`` or ``box``.
    """

    name: ClassVar[str] = "resize"
    column: str = "image"
    height: int | None = None
    width: int | None = None
    shorter_side: int | None = None
    resample: str = "bilinear"

    def __post_init__(self) -> None:
        _pos_int(self, height=self.height, width=self.width, shorter_side=self.shorter_side)
        exact = self.height is not None and self.width is not None
        if exact == (self.shorter_side is not None) or (
            (self.height is None) != (self.width is None)
        ):
            raise self._spec_error(
                "give either height and width (exact size) or shorter_side (keep aspect ratio)"
            )
        if self.resample not in RESAMPLE:
            raise self._spec_error(
                f"unknown resample {short_repr(self.resample)}; allowed: {', '.join(RESAMPLE)}"
            )

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        _, _, c, _ = self._layout(schema)
        t = fixed_type(self.height, self.width, c) if self.shorter_side is None else variable_type(c)
        return _set_schema(schema, pa.field(self.column, t))

    def _size(self, h: int, w: int) -> tuple[int, int]:
        if self.shorter_side is None:
            return self.height, self.width  # type: ignore[return-value]
        s = self.shorter_side
        if h <= w:
            return s, max(1, round(w * s / h))
        return max(1, round(h * s / w)), s

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        _, _, c, _ = image_layout(col.type)
        images, valid = read_images(col)
        exact = self.shorter_side is None
        dense = np.zeros((len(images), self.height, self.width, c), np.uint8) if exact else None

        def one(i: int) -> np.ndarray | None:
            im = images[i]
            if not valid[i]:
                return None
            h, w = self._size(im.shape[0], im.shape[1])
            r = _pil_resize(im, w, h, self.resample)
            if exact:
                dense[i] = r  # straight into the batch's (B, H, W, C) output
                return None
            return r

        # Pillow resamples without the GIL: images of a batch resize in parallel.
        out = _map_chunked(_pool(None), one, range(len(images)))
        if exact:
            return _set(table, self.column, write_fixed(dense, valid, pa.uint8()))
        return _set(table, self.column, write_variable(out, c))


def _crop(
    table: pa.Table,
    t: _ImageTransform,
    h: int,
    w: int,
    oy_frac: np.ndarray | None,
    ox_frac: np.ndarray | None,
) -> pa.Table:
    """Crops every image to (h, w) at offsets ``frac * (H - h)`` (centre when None)."""
    col = table.column(t.column)
    _, _, c, _ = image_layout(col.type)
    images, valid = read_images(col)
    n = len(valid)
    bad = np.zeros(n, bool)
    if isinstance(images, np.ndarray):
        H, W = images.shape[1:3]
        if H < h or W < w:
            bad[valid] = True
            dense = np.zeros((n, h, w, c), np.uint8)
            reason = f"{t._label()}: image {H}x{W} is smaller than the crop {h}x{w}; resize first"
        else:
            oy = ((H - h) // 2) * np.ones(n, np.int64) if oy_frac is None else (oy_frac * (H - h + 1)).astype(np.int64)
            ox = ((W - w) // 2) * np.ones(n, np.int64) if ox_frac is None else (ox_frac * (W - w + 1)).astype(np.int64)
            if oy_frac is None:
                dense = images[:, oy[0] : oy[0] + h, ox[0] : ox[0] + w]
            else:
                ys = oy[:, None, None] + np.arange(h)[None, :, None]
                xs = ox[:, None, None] + np.arange(w)[None, None, :]
                dense = images[np.arange(n)[:, None, None], ys, xs]
            reason = ""
        return mark_errors(
            _set(table, t.column, write_fixed(dense, valid & ~bad, pa.uint8())), bad, reason
        )
    dense = np.zeros((n, h, w, c), np.uint8)
    reasons = np.full(n, None, dtype=object)
    for i, im in enumerate(images):
        if im is None:
            continue
        H, W = im.shape[:2]
        if H < h or W < w:
            bad[i] = True
            reasons[i] = f"{t._label()}: image {H}x{W} is smaller than the crop {h}x{w}; resize first"
            continue
        oy = (H - h) // 2 if oy_frac is None else int(oy_frac[i] * (H - h + 1))
        ox = (W - w) // 2 if ox_frac is None else int(ox_frac[i] * (W - w + 1))
        dense[i] = im[oy : oy + h, ox : ox + w]
    table = _set(table, t.column, write_fixed(dense, valid & ~bad, pa.uint8()))
    return mark_errors(table, bad, reasons)


def _crop_schema(t: Any, schema: pa.Schema) -> pa.Schema:
    _, hw, c, _ = t._layout(schema)
    if hw is not None and (hw[0] < t.height or hw[1] < t.width):
        raise t._spec_error(
            f"column {short_repr(t.column)} holds {hw[0]}x{hw[1]} images, smaller than the crop "
            f"{t.height}x{t.width}"
        )
    return _set_schema(schema, pa.field(t.column, fixed_type(t.height, t.width, c)))


@dataclasses.dataclass(frozen=True)
class CenterCrop(_ImageTransform):
    """Crops the centre ``height x width`` (output: fixed layout).

    An image smaller than the crop marks its row bad.
    """

    name: ClassVar[str] = "center_crop"
    column: str = "image"
    height: int = 224
    width: int = 224

    def __post_init__(self) -> None:
        _pos_int(self, height=self.height, width=self.width)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        return _crop_schema(self, schema)

    def __call__(self, table: pa.Table) -> pa.Table:
        return _crop(table, self, self.height, self.width, None, None)


@dataclasses.dataclass(frozen=True)
class RandomCrop(_ImageTransform):
    """Crops a random ``height x width`` window, seeded per row.

    The offset is a function of (seed, ``_sf_file``, ``_sf_row``) only, so
    reruns crop identically. ``seed`` defaults to the pipeline seed.
    """

    name: ClassVar[str] = "random_crop"
    column: str = "image"
    height: int = 224
    width: int = 224
    seed: int | None = None

    def __post_init__(self) -> None:
        _pos_int(self, height=self.height, width=self.width)

    def with_seed(self, seed: int) -> Transform:
        return seeded_copy(self, seed)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        out = _crop_schema(self, schema)
        _require_identity(self, schema)
        return out

    def __call__(self, table: pa.Table) -> pa.Table:
        keys = row_keys(table, seed=self.seed or 0, salt=f"random_crop/{self.column}")
        return _crop(table, self, self.height, self.width, row_uniform(keys, 0), row_uniform(keys, 1))


def _require_identity(t: Transform, schema: pa.Schema) -> None:
    missing = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c not in schema.names]
    if missing:
        raise t._spec_error(
            f"needs the row identity columns {PROVENANCE_FILE!r} and {PROVENANCE_ROW!r} "
            "(readers add them with provenance=True) to draw per-row randomness; missing "
            + ", ".join(missing)
        )


@dataclasses.dataclass(frozen=True)
class RandomFlip(_ImageTransform):
    """Flips images horizontally and/or vertically with probability ``p``, seeded per row.

    Args:
        column: Image column.
        horizontal: Flip left-right. vertical: Flip top-bottom (drawn independently).
        p: Probability of each flip.
        seed: Defaults to the pipeline seed.
    """

    name: ClassVar[str] = "random_flip"
    column: str = "image"
    horizontal: bool = True
    vertical: bool = False
    p: float = 0.5
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise self._spec_error(f"p must be a probability in [0, 1]; got {short_repr(self.p)}")
        if not (self.horizontal or self.vertical):
            raise self._spec_error("set horizontal and/or vertical to true")

    def with_seed(self, seed: int) -> Transform:
        return seeded_copy(self, seed)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        kind, hw, c, _ = self._layout(schema)
        _require_identity(self, schema)
        if kind == "fixed":  # an older fixed_size_list image comes out as a tensor
            return _set_schema(schema, pa.field(self.column, fixed_type(*hw, c)))
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        kind, _, c, _ = image_layout(col.type)
        keys = row_keys(table, seed=self.seed or 0, salt=f"random_flip/{self.column}")
        fh = (row_uniform(keys, 0) < self.p) & bool(self.horizontal)
        fv = (row_uniform(keys, 1) < self.p) & bool(self.vertical)
        images, valid = read_images(col)
        if kind == "fixed":
            out = np.array(images, copy=True)
            out[fh] = out[fh][:, :, ::-1]
            out[fv] = out[fv][:, ::-1]
            return _set(table, self.column, write_fixed(out, valid, pa.uint8()))
        res = []
        for im, h, v in zip(images, fh, fv):
            if im is not None:
                im = im[:, ::-1] if h else im
                im = im[::-1] if v else im
            res.append(im)
        return _set(table, self.column, write_variable(res, c))


def _float32_number(x: Any) -> bool:
    """Whether ``x`` is a real number that float32 holds as a finite value."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return abs(float(x)) <= float(np.finfo(np.float32).max)  # False for NaN
    except OverflowError:  # an int beyond float64
        return False


@dataclasses.dataclass(frozen=True)
class NormalizeImage(_ImageTransform):
    """Turns fixed-size uint8 images into the training dtype.

    ``float32``/``bfloat16``: ``(pixel / 255 - mean) / std`` per channel;
    bfloat16 is stored as uint16 bits with field metadata. ``uint8`` keeps the
    pixels (mean/std not allowed). Output: fixed layout ``(H, W, C)``.

    Args:
        column: Fixed-size image column.
        mean: Per-channel means in [0, 1] units (one value or one per channel).
        std: Per-channel standard deviations, likewise.
        dtype: ``uint8``, ``float32`` or ``bfloat16``.
        output: Output column (default: replace ``column``).
    """

    name: ClassVar[str] = "normalize_image"
    column: str = "image"
    mean: tuple[float, ...] | float = 0.0
    std: tuple[float, ...] | float = 1.0
    dtype: str = "float32"
    output: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in IMAGE_DTYPES:
            raise self._spec_error(f"unknown dtype {short_repr(self.dtype)}; allowed: {', '.join(IMAGE_DTYPES)}")
        for k in ("mean", "std"):
            v = getattr(self, k)
            vs = v if isinstance(v, (list, tuple)) else [v]
            if not vs or not all(_float32_number(x) for x in vs):
                raise self._spec_error(
                    f"{k} must be a number (finite, within float32) or a list of one per "
                    f"channel; got {short_repr(v)}"
                )
            if isinstance(v, (list, tuple)):
                object.__setattr__(self, k, tuple(float(x) for x in v))
        std = np.atleast_1d(np.asarray(self.std, dtype=np.float64))
        if (std <= 0).any():
            raise self._spec_error(f"std must be positive; got {short_repr(self.std)}")
        if self.dtype == "uint8" and (self.mean != 0.0 or self.std != 1.0):
            raise self._spec_error("dtype uint8 keeps raw pixels; remove mean/std or use float32")

    def _value_type(self) -> pa.DataType:
        return {"uint8": pa.uint8(), "float32": pa.float32(), "bfloat16": pa.uint16()}[self.dtype]

    def _field(self, h: int, w: int, c: int) -> pa.Field:
        t = fixed_type(h, w, c, self._value_type())
        if self.dtype == "bfloat16":
            return bfloat16_field(self.out, t)
        return pa.field(self.out, t)

    def _stats(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        mean = np.atleast_1d(np.asarray(self.mean, np.float32))
        std = np.atleast_1d(np.asarray(self.std, np.float32))
        for k, v in (("mean", mean), ("std", std)):
            if len(v) not in (1, c):
                raise self._spec_error(f"{k} has {len(v)} values; the image has {c} channels")
        return mean, std

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        kind, hw, c, _ = self._layout(schema)
        if kind != "fixed":
            raise self._spec_error(
                f"column {short_repr(self.column)} holds images of varying size; add Resize(height, "
                "width), CenterCrop or RandomCrop before NormalizeImage"
            )
        self._stats(c)
        return _set_schema(schema, self._field(hw[0], hw[1], c))

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        images, valid = read_images(col)
        _, h, w, c = images.shape
        if self.dtype == "uint8":
            out = images
        else:
            mean, std = self._stats(c)
            scale = (1.0 / (255.0 * std)).astype(np.float32)
            out = images.astype(np.float32) * scale - (mean / std).astype(np.float32)
            if self.dtype == "bfloat16":
                out = to_bfloat16_bits(out)
        arr = write_fixed(out, valid, self._value_type())
        return _set(table, self.out, arr, self._field(h, w, c))
