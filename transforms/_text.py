"""Text transforms: Tokenize and PadOrTruncate."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import SpecError, printable, short_repr
from slicefeed.transforms._arrays import (
    MAX_ROW_LENGTH,
    failing_rows,
    list_parts,
    make_list,
    make_tensor,
    null_value_rows,
    segment_arange,
    tensor_type,
)
from slicefeed.transforms._badrecords import mark_errors
from slicefeed.transforms._contract import Transform

#: Built-in byte-level tokenizer: 0 = padding, 1 = BOS, 2 = EOS, byte b -> b + 3.
BYTE_PAD_ID, BYTE_BOS_ID, BYTE_EOS_ID, BYTE_OFFSET = 0, 1, 2, 3
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET

#: Tokenizers by the SHA-256 of their tokenizer.json bytes: a file's content,
#: not its name, decides which tokenizer encodes (the rerun fingerprint records
#: that same digest), so a replaced file is never served from here.
_BY_DIGEST: dict[str, Any] = {}
#: uri -> ((size, generation or mtime_ns), digest): the cheap per-call check that
#: the bytes last read from ``uri`` are still the file's; any change re-reads.
_STAMPS: dict[str, tuple[tuple[Any, Any], str]] = {}
_CACHE_LOCK = threading.Lock()


_INT32_MAX = int(np.iinfo(np.int32).max)


def _stamp(r) -> tuple[Any, Any]:
    """``(size, generation)`` of a tokenizer file now, as the input listing
    records them (:func:`~slicefeed.connectors._commit.size_generation`): one
    metadata request, no content.

    A local file rewritten in place with the same size within one tick of the
    filesystem's clock keeps its stamp; the input listing has the same limit.
    """
    from slicefeed.connectors._commit import size_generation

    # A listing cached by this filesystem instance may predate a replacement.
    r.fs.invalidate_cache(r.path)
    return size_generation(r, r.path, r.fs.info(r.path))


def load_hf_tokenizer(uri: str, *, sha256: str | None = None):
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` path or gs:// URI.

    Fetches the file's bytes through :func:`slicefeed.connectors.resolve_filesystem`
    (the only storage access in transforms). Tokenizers are kept per process
    (so each Ray worker parses a file once) by the SHA-256 of those bytes.

    Without ``sha256``, each call checks the file's size and generation (GCS)
    or modification time (local): while they are the ones last seen, the
    tokenizer parsed from those bytes is returned; otherwise the bytes are read
    again, so a replaced file is never tokenized with the tokenizer of its
    former content.

    With ``sha256`` (the digest a pipeline run's fingerprint records for the
    file, bound by :meth:`Tokenize.with_file_digests`), the tokenizer of exactly
    that content: a process that holds it answers without touching storage;
    one that does not reads the file and refuses it if its bytes are no longer
    that content.

    Raises:
        FileNotFoundError: naming the URI.
        ValueError: if the file is not a valid tokenizer.json.
        RuntimeError: with ``sha256``, the file's content is another one (it
            changed after the run was planned).
    """
    from slicefeed.connectors import resolve_filesystem

    if sha256 is not None:
        with _CACHE_LOCK:
            tok = _BY_DIGEST.get(sha256)
        if tok is not None:
            return tok
    r = resolve_filesystem(uri)
    try:
        stamp = _stamp(r)
    except (OSError, ValueError):
        stamp = None  # reported by the read below
    with _CACHE_LOCK:
        seen = _STAMPS.get(uri)
        if sha256 is None and stamp is not None and seen is not None and seen[0] == stamp:
            tok = _BY_DIGEST.get(seen[1])
            if tok is not None:
                return tok
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # pragma: no cover
        raise ImportError(
            "Tokenize with a tokenizer.json needs the 'tokenizers' package: "
            "pip install 'slicefeed[tokenizers]'"
        ) from e
    try:
        data = r.fs.cat_file(r.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Tokenize: tokenizer file {printable(uri, 200)} does not exist; pass the path or gs:// "
            "URI of a Hugging Face tokenizer.json, or tokenizer: bytes for the built-in one."
        ) from None
    except OSError as e:  # a name too long, a directory, no permission: quoted bounded
        raise OSError(
            f"Tokenize: cannot read tokenizer file {printable(uri, 200)} "
            f"({type(e).__name__}: {printable(e.strerror or str(e), 200)}); pass the path or "
            "gs:// URI of a Hugging Face tokenizer.json, or tokenizer: bytes for the built-in one."
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise RuntimeError(
            f"Tokenize: tokenizer file {printable(uri, 200)} changed after the run was planned "
            f"(its SHA-256 is now {digest[:16]}..., the plan recorded {printable(sha256, 16)}...), "
            "so its rows would mix two tokenizers; a batch run commits nothing then. Run the "
            "pipeline again once the file is final: the new run plans with its current content."
        )
    with _CACHE_LOCK:
        tok = _BY_DIGEST.get(digest)
    if tok is None:
        try:
            tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:
            raise SpecError(
                f"Tokenize: {printable(uri, 200)} is not a valid tokenizer.json ({printable(str(e), 300)})"
            ) from e
    with _CACHE_LOCK:
        _BY_DIGEST[digest] = tok
        if stamp is not None:
            # The stamp was taken before the read: if the file changed in between,
            # the next call sees a newer stamp and reads again.
            _STAMPS[uri] = (stamp, digest)
        # Only tokenizers some file still holds stay loaded.
        live = {d for _, d in _STAMPS.values()} | {digest}
        for d in [d for d in _BY_DIGEST if d not in live]:
            del _BY_DIGEST[d]
    return tok


def _frame(
    values: np.ndarray,
    offsets: np.ndarray,
    *,
    bos: int | None,
    eos: int | None,
    max_length: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Adds BOS/EOS and truncates, vectorised. Returns (values int32, offsets)."""
    lengths = np.diff(offsets)
    extra = int(bos is not None) + int(eos is not None)
    keep = lengths if max_length is None else np.minimum(lengths, max(max_length - extra, 0))
    new_len = keep + extra
    new_off = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64)
    out = np.empty(int(new_off[-1]), dtype=np.int32)
    if extra and (keep == lengths).all():
        # Nothing truncated: content stays in order, so fill every position that
        # is not BOS/EOS with one boolean-mask assignment (no per-token indices).
        special = np.zeros(len(out), dtype=bool)
        if bos is not None:
            special[new_off[:-1]] = True
        if eos is not None:
            special[new_off[1:] - 1] = True
        out[~special] = values
        if bos is not None:
            out[new_off[:-1]] = bos
        if eos is not None:
            out[new_off[1:] - 1] = eos
        return out, new_off
    if not extra and (keep == lengths).all():
        return values.astype(np.int32, copy=False), offsets.astype(np.int64, copy=False)
    within = segment_arange(keep)
    src = np.repeat(offsets[:-1], keep) + within
    dst = np.repeat(new_off[:-1] + int(bos is not None), keep) + within
    out[dst] = values[src]
    if bos is not None:
        out[new_off[:-1]] = bos
    if eos is not None:
        out[new_off[1:] - 1] = eos
    return out, new_off


@dataclasses.dataclass(frozen=True)
class Tokenize(Transform):
    """Tokenizes a text column into ``list<int32>`` token ids.

    ``tokenizer: bytes`` (default) is the built-in byte-level tokenizer: UTF-8
    bytes ``b -> b + 3`` with 0 = padding, 1 = BOS, 2 = EOS (vocabulary 259),
    fully vectorised. Otherwise ``tokenizer`` is a local path or gs:// URI of a
    Hugging Face ``tokenizer.json``, encoded with ``encode_batch``.

    Null text and text that is not valid UTF-8 (in a binary column) mark the
    row bad; its output is null.

    Args:
        column: Input column (string or binary).
        tokenizer: ``"bytes"`` or a tokenizer.json path / URI.
        output: Output column (``list<int32>``).
        add_bos: Prepend the BOS id. add_eos: Append the EOS id.
        bos_token: BOS token (string looked up in the vocabulary, or an id in
            ``[0, 2**31 - 1]``);
            defaults to 1 for ``bytes``; required with a tokenizer.json.
        eos_token: EOS token, likewise (default 2 for ``bytes``).
        max_length: Truncate to at most this many ids (BOS/EOS included).
        add_special_tokens: Let a tokenizer.json's post-processor add its own
            special tokens (``encode_batch(..., add_special_tokens=...)``).
    """

    name: ClassVar[str] = "tokenize"
    column: str = "text"
    tokenizer: str = "bytes"
    output: str = "tokens"
    add_bos: bool = False
    add_eos: bool = False
    bos_token: str | int | None = None
    eos_token: str | int | None = None
    max_length: int | None = None
    add_special_tokens: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise self._spec_error(
                f"tokenizer must be 'bytes' or a tokenizer.json path/URI; got {short_repr(self.tokenizer)}"
            )
        if self.max_length is not None and (
            not isinstance(self.max_length, int)
            or self.max_length < 1 + int(self.add_bos) + int(self.add_eos)
        ):
            raise self._spec_error(
                f"max_length must be an integer >= {1 + int(self.add_bos) + int(self.add_eos)}"
                f" (room for BOS/EOS and one token); got {short_repr(self.max_length)}"
            )
        if not self.output or not isinstance(self.output, str):
            raise self._spec_error(f"output must be a column name; got {short_repr(self.output)}")
        for which in ("bos", "eos"):
            value = getattr(self, f"{which}_token")
            if isinstance(value, int) and not 0 <= value <= _INT32_MAX:
                raise self._spec_error(
                    f"{which}_token {short_repr(value)} is not a token id: ids are integers in "
                    f"[0, {_INT32_MAX}] (the tokens' type is int32); give an id in that range or "
                    "the token's string"
                )

    @property
    def is_bytes(self) -> bool:
        return self.tokenizer == "bytes"

    def with_file_digests(self, digests: Mapping[str, str]) -> Tokenize:
        """A copy that tokenizes with the ``tokenizer.json`` content of SHA-256
        ``digests[tokenizer]`` (see :func:`load_hf_tokenizer`): no file check per
        batch. The digest stays out of :meth:`to_spec`, ``repr`` and equality."""
        digest = None if self.is_bytes else digests.get(self.tokenizer)
        if digest is None:
            return self
        new = dataclasses.replace(self)
        object.__setattr__(new, "_sha256", digest)
        return new

    def _tokenizer(self):
        """The tokenizer.json's tokenizer (None for ``bytes``), of the bound content if any."""
        if self.is_bytes:
            return None
        return load_hf_tokenizer(self.tokenizer, sha256=getattr(self, "_sha256", None))

    def _special(self, tok, which: str) -> int | None:
        want = self.add_bos if which == "bos" else self.add_eos
        if not want:
            return None
        value = self.bos_token if which == "bos" else self.eos_token
        if value is None:
            if self.is_bytes:
                return BYTE_BOS_ID if which == "bos" else BYTE_EOS_ID
            raise self._spec_error(
                f"add_{which}: true needs {which}_token (e.g. '<s>' or an id) with a "
                "tokenizer.json"
            )
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self._spec_error(f"{which}_token must be a token string or an id; got {short_repr(value)}")
        if isinstance(value, int):
            return value
        if self.is_bytes:
            raise self._spec_error(
                f"{which}_token must be an id with tokenizer: bytes; got {short_repr(value)}"
            )
        tid = tok.token_to_id(value)
        if tid is None:
            raise self._spec_error(
                f"{which}_token {short_repr(value)} is not in the vocabulary of {printable(self.tokenizer, 200)}"
            )
        return int(tid)

    def vocab_size(self) -> int:
        """Vocabulary size (loads the tokenizer.json if one is used)."""
        if self.is_bytes:
            return BYTE_VOCAB_SIZE
        return int(self._tokenizer().get_vocab_size(with_added_tokens=True))

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        self._require(schema, self.column, kinds=("string", "binary"))
        tok = self._tokenizer()
        self._special(tok, "bos")
        self._special(tok, "eos")
        field = pa.field(self.output, pa.list_(pa.int32()))
        if self.output in schema.names:
            return schema.set(schema.get_field_index(self.output), field)
        return schema.append(field)

    def _utf8(self, arr: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """(string array with bad rows nulled, bad mask, reasons)."""
        n = len(arr)
        bad = ~arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.zeros(n, bool)
        reasons = np.full(n, None, dtype=object)
        reasons[bad] = f"Tokenize: column {short_repr(self.column)} is null"
        if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
            target = pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string()
            try:
                arr = arr.cast(target)
            except pa.ArrowInvalid:
                not_utf8 = failing_rows(arr, lambda a: a.cast(target))
                reasons[not_utf8] = f"Tokenize: column {short_repr(self.column)} is not valid UTF-8"
                bad |= not_utf8
                arr = pc.if_else(pa.array(not_utf8), pa.nulls(n, arr.type), arr).cast(target)
        return arr, bad, reasons

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        arr, bad, reasons = self._utf8(arr)
        valid = ~bad
        # One tokenizer for the whole batch: one file check per batch, none once
        # bound to the digest of a run's fingerprint.
        tok = self._tokenizer()
        if self.is_bytes:
            values, offsets, _ = list_parts(arr)
            values = values.astype(np.int32) + BYTE_OFFSET
        else:
            texts = arr.to_pylist()
            idx = np.flatnonzero(valid)
            if len(idx) < len(texts):
                texts = [texts[i] for i in idx]
            # The Rust batch encoder is the cost; encode_batch_fast (tokenizers
            # >= 0.20) gives the same ids without computing character offsets.
            encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
            ids = [e.ids for e in encode(texts, add_special_tokens=self.add_special_tokens)]
            lengths = np.zeros(len(arr), np.int64)
            lengths[idx] = np.fromiter(map(len, ids), np.int64, len(ids))
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            values = np.fromiter(
                itertools.chain.from_iterable(ids), np.int32, int(offsets[-1])
            )
        bos, eos = self._special(tok, "bos"), self._special(tok, "eos")
        lengths = np.where(valid, np.diff(offsets), 0)
        if not valid.all():
            values = values[np.repeat(valid, np.diff(offsets))]
            offsets = np.concatenate([[0], np.cumsum(lengths)])
        values, offsets = _frame(values, offsets, bos=bos, eos=eos, max_length=self.max_length)
        # Bad rows: null output (lengths there are BOS/EOS only; drop them).
        if not valid.all():
            lens = np.diff(offsets)
            keep = np.repeat(valid, lens)
            values = values[keep]
            offsets = np.concatenate([[0], np.cumsum(np.where(valid, lens, 0))])
        out = make_list(values, offsets, valid, pa.int32())
        field = pa.field(self.output, out.type)
        if self.output in table.column_names:
            table = table.set_column(table.column_names.index(self.output), field, out)
        else:
            table = table.append_column(field, out)
        return mark_errors(table, bad, reasons)


@dataclasses.dataclass(frozen=True)
class PadOrTruncate(Transform):
    """Pads or truncates a list column to a fixed length.

    Output: an ``arrow.fixed_shape_tensor`` of T (the input's value type) and
    shape ``(length,)``, plus ``<output>_length`` (int32, number of real values
    kept) and, with ``mask: true``, ``<output>_mask`` (a tensor of uint8, shape
    ``(length,)``, 1 where a real value was kept: Arrow packs booleans into
    bits, which a tensor cannot hold, and Ray Data fails on a bool tensor
    column). The input may be any list column, including a
    ``fixed_size_list`` or one-dimensional tensor column.
    A null list marks its row bad, and so does a list holding a null value
    (a fixed-shape row cannot hold one; it is never written as a number).

    Args:
        column: Input list column.
        length: Output length.
        pad_value: Value for padding; it must fit the list's value type (within
            an integer type's range and whole, or finite in a float type when
            finite), else a SpecError at the schema check.
        output: Output column (default: replace ``column``).
        side: ``"right"`` (pad/truncate at the end) or ``"left"``.
        lengths: Add the ``_length`` column.
        mask: Add the ``_mask`` column.
    """

    name: ClassVar[str] = "pad_or_truncate"
    column: str
    length: int
    pad_value: int | float = 0
    output: str | None = None
    side: str = "right"
    lengths: bool = True
    mask: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise self._spec_error(f"length must be a positive integer; got {short_repr(self.length)}")
        if self.length > MAX_ROW_LENGTH:
            raise self._spec_error(
                f"length must be at most {MAX_ROW_LENGTH} (one row's list is allocated at "
                f"this length); got {short_repr(self.length)}"
            )
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, (int, float)):
            raise self._spec_error(f"pad_value must be a number; got {short_repr(self.pad_value)}")
        if self.side not in ("right", "left"):
            raise self._spec_error(f"side must be 'right' or 'left'; got {short_repr(self.side)}")

    @property
    def out(self) -> str:
        return self.output or self.column

    def _fields(self, value_type: pa.DataType) -> list[pa.Field]:
        fs = [pa.field(self.out, tensor_type(value_type, (self.length,)))]
        if self.lengths:
            fs.append(pa.field(f"{self.out}_length", pa.int32()))
        if self.mask:
            fs.append(pa.field(f"{self.out}_mask", tensor_type(pa.uint8(), (self.length,))))
        return fs

    def _check_pad(self, value_type: pa.DataType) -> None:
        """Refuses a ``pad_value`` the list's value type cannot hold: out of an
        integer type's range or fractional, or finite but infinite in a float type."""
        try:
            v = pa.scalar(self.pad_value).cast(value_type, safe=True).as_py()
            ok = not (
                pa.types.is_floating(value_type)
                and np.isfinite(self.pad_value)
                and not np.isfinite(v)
            )
        except (pa.ArrowInvalid, OverflowError):
            ok = False
        if not ok:
            raise self._spec_error(
                f"pad_value {short_repr(self.pad_value)} does not fit the list's value type "
                f"{value_type} (column {short_repr(self.column)}); use a value of that type"
            )

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        t = self._require(schema, self.column, kinds=("list",))
        if not (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
            raise self._spec_error(
                f"column {short_repr(self.column)} has type {t}; expected a list of numbers"
            )
        self._check_pad(t.value_type)
        for f in self._fields(t.value_type):
            if f.name in schema.names:
                schema = schema.set(schema.get_field_index(f.name), f)
            else:
                schema = schema.append(f)
        return schema

    def __call__(self, table: pa.Table) -> pa.Table:
        col = table.column(self.column)
        value_type = col.type.value_type
        self._check_pad(value_type)  # also where the schema check was not run
        values, offsets, valid = list_parts(col)
        held_null = null_value_rows(col)
        n, L = len(valid), self.length
        lengths = np.diff(offsets)
        keep = np.minimum(lengths, L)
        np_type = value_type.to_pandas_dtype()
        out = np.full(n * L, self.pad_value, dtype=np_type)
        within = segment_arange(keep)
        if self.side == "right":
            src = np.repeat(offsets[:-1], keep) + within
            dst = np.repeat(np.arange(n) * L, keep) + within
        else:
            src = np.repeat(offsets[1:] - keep, keep) + within
            dst = np.repeat(np.arange(n) * L + (L - keep), keep) + within
        out[dst] = values[src]
        fields = self._fields(value_type)
        # A row holding a null is bad: its output is null, never the 0 read for the null.
        arrays = [make_tensor(out, (L,), ~held_null if held_null.any() else None, value_type)]
        if self.lengths:
            arrays.append(pa.array(keep.astype(np.int32)))
        if self.mask:
            m = np.zeros(n * L, dtype=np.uint8)
            m[dst] = 1
            arrays.append(make_tensor(m, (L,), None, pa.uint8()))
        for f, a in zip(fields, arrays):
            if f.name in table.column_names:
                table = table.set_column(table.column_names.index(f.name), f, a)
            else:
                table = table.append_column(f, a)
        reasons = np.full(n, None, dtype=object)
        reasons[~valid] = f"PadOrTruncate: column {short_repr(self.column)} is null"
        reasons[held_null] = (
            f"PadOrTruncate: column {short_repr(self.column)} holds a null inside its list "
            "(a fixed-shape row has no null); fill or drop it before pad_or_truncate"
        )
        return mark_errors(table, ~valid | held_null, reasons)
