"""Tokenize (built-in bytes, Hugging Face tokenizer.json from disk and gs://) and PadOrTruncate."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from slicefeed.connectors import BadRecordError, SpecError, resolve_filesystem
from slicefeed.transforms import (
    ERROR_COLUMN,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    PadOrTruncate,
    Tokenize,
    apply_transforms,
    split_errors,
    transform_from_spec,
)

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "héllo wörld — ünïcode ✓",
    "",
    "packing sequences for tensor processing units",
    "the lazy dog sleeps",
]


def _table(texts=TEXTS, type_=pa.string()) -> pa.Table:  # noqa: B008 - DataTypes are immutable
    n = len(texts)
    return pa.table(
        {
            "text": pa.array(texts, type_),
            "id": list(range(n)),
            PROVENANCE_FILE: ["corpus/part-0.jsonl"] * n,
            PROVENANCE_ROW: pa.array(range(n), pa.int64()),
        }
    )


def test_byte_tokenizer_matches_utf8_bytes():
    out = Tokenize()(_table())
    assert out.schema.field("tokens").type == pa.list_(pa.int32())
    for text, ids in zip(TEXTS, out.column("tokens").to_pylist()):
        assert ids == [b + 3 for b in text.encode("utf-8")]
    assert out.schema == Tokenize().output_schema(_table().schema)


def test_byte_tokenizer_bos_eos_and_max_length():
    t = Tokenize(add_bos=True, add_eos=True, max_length=8)
    ids = t(_table()).column("tokens").to_pylist()
    assert ids[0] == [1] + [b + 3 for b in b"the qu"] + [2]
    assert ids[2] == [1, 2]  # empty text: BOS + EOS
    assert all(len(x) <= 8 for x in ids)
    ids = Tokenize(add_eos=True, eos_token=7)(_table(["ab"])).column("tokens").to_pylist()
    assert ids == [[100, 101, 7]]


def test_chunked_and_sliced_input():
    tbl = pa.concat_tables([_table().slice(1, 2), _table().slice(3, 2)])
    assert tbl.column("text").num_chunks == 2
    ids = Tokenize()(tbl).column("tokens").to_pylist()
    assert ids == [[b + 3 for b in t.encode()] for t in TEXTS[1:5]]


def test_null_and_non_utf8_are_bad_records():
    tbl = _table([b"ok", b"\xff\xfebad", None, b"fine"], pa.binary())
    out = Tokenize()(tbl)
    assert out.column("tokens").to_pylist() == [[114, 110], None, None, [105, 108, 113, 104]]
    assert out.column(ERROR_COLUMN).to_pylist() == [
        None,
        "Tokenize: column 'text' is not valid UTF-8",
        "Tokenize: column 'text' is null",
        None,
    ]
    with pytest.raises(
        BadRecordError,
        match=r"Tokenize: bad record at file 'corpus/part-0.jsonl' row 1: Tokenize: column "
        r"'text' is not valid UTF-8 \(2 bad rows in this batch\)",
    ):
        apply_transforms(tbl, [Tokenize()])
    good = apply_transforms(tbl, [Tokenize()], on_error="skip")
    assert good.column("id").to_pylist() == [0, 3]


def test_tokenize_schema_errors():
    schema = _table().schema
    with pytest.raises(SpecError, match=r"^Tokenize: column 'txt' not found; available: text, id\."):
        Tokenize(column="txt").output_schema(schema)
    with pytest.raises(SpecError, match=r"Tokenize: column 'id' has type int64; expected string or binary"):
        Tokenize(column="id").output_schema(schema)
    with pytest.raises(SpecError, match=r"max_length must be an integer >= 3"):
        Tokenize(add_bos=True, add_eos=True, max_length=2)
    with pytest.raises(SpecError, match=r"tokenize: unknown argument 'max_len'; allowed arguments: column='text'"):
        transform_from_spec({"tokenize": {"max_len": 3}})
    with pytest.raises(FileNotFoundError, match=r"tokenizer file .*missing.json does not exist"):
        Tokenize(tokenizer="/nonexistent/missing.json").output_schema(schema)


# -- Hugging Face tokenizer.json ---------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer_json(tmp_path_factory) -> str:
    """A small BPE tokenizer trained here (no downloads), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture
def gs_tokenizer(hf_tokenizer_json, bucket) -> str:
    uri = f"gs://{bucket}/tokenizers/my tok/tokenizer.json"
    r = resolve_filesystem(uri)
    with open(hf_tokenizer_json, "rb") as f:
        r.fs.pipe_file(r.path, f.read())
    return uri


def test_hf_tokenizer_from_gcs_matches_encode_batch(hf_tokenizer_json, gs_tokenizer):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(hf_tokenizer_json)
    expect = [e.ids for e in ref.encode_batch(TEXTS, add_special_tokens=False)]
    assert sum(len(e) for e in expect) < sum(len(t.encode()) for t in TEXTS)  # real merges
    t = Tokenize(tokenizer=gs_tokenizer)
    out = t(_table())
    assert out.column("tokens").to_pylist() == expect
    assert t.output_schema(_table().schema) == out.schema
    framed = Tokenize(
        tokenizer=gs_tokenizer, add_bos=True, add_eos=True, bos_token="<s>", eos_token="</s>", max_length=6
    )(_table()).column("tokens").to_pylist()
    bos, eos = ref.token_to_id("<s>"), ref.token_to_id("</s>")
    assert framed == [[bos, *e[:4], eos] for e in expect]
    local = Tokenize(tokenizer=hf_tokenizer_json)(_table()).column("tokens").to_pylist()
    assert local == expect


def test_hf_tokenizer_in_ray_workers(gs_tokenizer, hf_tokenizer_json, ray_cluster):
    import ray
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(hf_tokenizer_json)
    ds = ray.data.from_arrow(_table()).map_batches(
        Tokenize(tokenizer=gs_tokenizer), batch_format="pyarrow", batch_size=2
    )
    got = ds.to_arrow_refs()
    rows = pa.concat_tables(ray.get(got)).sort_by("id")
    assert rows.column("tokens").to_pylist() == [
        e.ids for e in ref.encode_batch(TEXTS, add_special_tokens=False)
    ]


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_replaced_tokenizer_file_is_read_again(where, tmp_path, request):
    """A tokenizer.json is parsed once per content: an unchanged file is served
    from the process's cache, a replaced one (same name) is read again."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from slicefeed.transforms import load_hf_tokenizer

    if where == "local":
        uri = str(tmp_path / "tok dir" / "tokenizer.json")
    else:
        uri = f"gs://{request.getfixturevalue('bucket')}/t/tokenizer.json"
    r = resolve_filesystem(uri)
    r.fs.makedirs(r.path.rsplit("/", 1)[0], exist_ok=True)

    def save(vocab) -> None:
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        r.fs.pipe_file(r.path, tok.to_str().encode())

    save({"[UNK]": 0, "hello": 1})
    first = load_hf_tokenizer(uri)
    assert load_hf_tokenizer(uri) is first  # unchanged: not parsed again
    assert first.encode("hello").ids == [1]
    save({"[UNK]": 0, "hello": 17})  # another size: seen even where mtimes are coarse
    assert load_hf_tokenizer(uri).encode("hello").ids == [17]
    t = Tokenize(column="text", tokenizer=uri)
    out = t(pa.table({"text": ["hello"]}))
    assert out.column("tokens").to_pylist() == [[17]]


def test_tokenize_bound_to_a_digest_uses_that_content_and_refuses_another(tmp_path):
    """A pipeline run binds the tokenizer.json's digest from its fingerprint:
    batches then tokenize with that content without checking the file (it may
    even be gone), and a process that must read the file refuses content that
    changed after the run was planned."""
    import hashlib

    from tokenizers import Tokenizer, models, pre_tokenizers

    path = str(tmp_path / "tokenizer.json")

    def save(vocab) -> str:
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        data = tok.to_str().encode()
        with open(path, "wb") as f:
            f.write(data)
        return hashlib.sha256(data).hexdigest()

    table = pa.table({"text": ["bound"]})
    planned = save({"[UNK]": 0, "bound": 41})
    t = Tokenize(tokenizer=path).with_file_digests({path: planned, "other.json": "0" * 64})
    assert t == Tokenize(tokenizer=path) and t.to_spec() == Tokenize(tokenizer=path).to_spec()
    assert t(table).column("tokens").to_pylist() == [[41]]
    (tmp_path / "tokenizer.json").unlink()  # no storage access per batch
    assert t(table).column("tokens").to_pylist() == [[41]]
    # Planned, then changed before this process read it: refused.
    planned = save({"[UNK]": 0, "bound": 42, "planned": 1})
    save({"[UNK]": 0, "bound": 43})
    with pytest.raises(RuntimeError, match=r"tokenizer\.json changed after the run was planned"):
        Tokenize(tokenizer=path).with_file_digests({path: planned})(table)
    assert Tokenize(tokenizer=path)(table).column("tokens").to_pylist() == [[43]]  # unbound


def test_hf_special_tokens_must_exist(gs_tokenizer):
    with pytest.raises(SpecError, match=r"add_bos: true needs bos_token"):
        Tokenize(tokenizer=gs_tokenizer, add_bos=True).output_schema(_table().schema)
    with pytest.raises(SpecError, match=r"eos_token '<eos>' is not in the vocabulary of gs://"):
        Tokenize(tokenizer=gs_tokenizer, add_eos=True, eos_token="<eos>").output_schema(
            _table().schema
        )


# -- PadOrTruncate -------------------------------------------------------------------


def _lists() -> pa.Table:
    return pa.table(
        {
            "ids": pa.array([[1, 2, 3, 4, 5], [6], [], None], pa.list_(pa.int32())),
            PROVENANCE_FILE: ["f"] * 4,
            PROVENANCE_ROW: pa.array(range(4), pa.int64()),
        }
    )


def test_pad_or_truncate_right_with_mask():
    t = PadOrTruncate("ids", 3, pad_value=-1, mask=True)
    out = t(_lists())
    assert split_errors(out)[0].schema == t.output_schema(_lists().schema)
    assert out.schema.field("ids").type == pa.fixed_shape_tensor(pa.int32(), (3,))
    assert out.column("ids").to_pylist()[:3] == [[1, 2, 3], [6, -1, -1], [-1, -1, -1]]
    assert out.column("ids_length").to_pylist()[:3] == [3, 1, 0]
    assert out.column("ids_mask").to_pylist()[:3] == [[1] * 3, [1, 0, 0], [0] * 3]
    good, bad = split_errors(out)
    assert good.num_rows == 3 and bad.column(ERROR_COLUMN).to_pylist() == [
        "PadOrTruncate: column 'ids' is null"
    ]


def test_pad_or_truncate_left_and_output_column():
    out = PadOrTruncate("ids", 3, side="left", output="x", lengths=False)(_lists().slice(0, 3))
    assert out.column("x").to_pylist() == [[3, 4, 5], [0, 0, 6], [0, 0, 0]]
    assert out.column("ids").type == pa.list_(pa.int32()) and "x_length" not in out.column_names
    dense = out.column("x").combine_chunks().to_numpy_ndarray()
    np.testing.assert_array_equal(dense[:, -1], [5, 6, 0])


def test_pad_or_truncate_null_inside_a_list_is_a_bad_record():
    big = 2**60 + 1  # no float64: a good row's ids stay exact next to a row holding a null
    tbl = pa.table(
        {
            "ids": pa.array([[1, None, 3], [big, 2], None, [None]], pa.list_(pa.int64())),
            "x": pa.array([[1.5, None], [2.5], [3.5], [None, 1.0]], pa.list_(pa.float32())),
            PROVENANCE_FILE: ["f"] * 4,
            PROVENANCE_ROW: pa.array(range(4), pa.int64()),
        }
    )
    pad = transform_from_spec({"pad_or_truncate": {"column": "ids", "length": 4}})
    good, bad = split_errors(pad(tbl))
    assert good.column("ids").to_pylist() == [[big, 2, 0, 0]]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 2, 3]
    held = ("PadOrTruncate: column 'ids' holds a null inside its list (a fixed-shape row has no null); "
            "fill or drop it before pad_or_truncate")
    assert bad.column(ERROR_COLUMN).to_pylist() == [held, "PadOrTruncate: column 'ids' is null", held]
    good, bad = split_errors(PadOrTruncate("x", 3)(tbl))
    assert good.column("x").to_pylist() == [[2.5, 0, 0], [3.5, 0, 0]]
    assert bad.column(PROVENANCE_ROW).to_pylist() == [0, 3]
    with pytest.raises(BadRecordError, match=r"row 0: PadOrTruncate: column 'ids' holds a null inside its list"):
        apply_transforms(tbl, [pad])


@pytest.mark.slow
def test_pad_or_truncate_schema_errors():
    with pytest.raises(SpecError, match=r"PadOrTruncate: column 'tokens' not found; available: ids"):
        PadOrTruncate("tokens", 4).output_schema(_lists().schema)
    with pytest.raises(SpecError, match=r"PadOrTruncate: column 'f' has type string; expected list"):
        PadOrTruncate("f", 4).output_schema(pa.schema([("f", pa.string())]))
    with pytest.raises(SpecError, match=r"length must be a positive integer; got 0"):
        PadOrTruncate("ids", 0)
    with pytest.raises(SpecError, match=r"side must be 'right' or 'left'; got 'top'"):
        PadOrTruncate("ids", 2, side="top")


@pytest.mark.parametrize("value_type, pad_value", [
    (pa.float32(), 1e308), (pa.float32(), 1e39), (pa.float16(), 70_000.0),
    (pa.int8(), 300), (pa.uint8(), -1), (pa.int32(), 0.5), (pa.int64(), 2**70),
])
def test_pad_value_must_fit_the_column_type(value_type, pad_value):
    """pad_value is checked against the list's value type in the schema check:
    out of range, fractional for integers, or finite but infinite in a float
    type is a SpecError naming pad_value, the type and the column."""
    tbl = pa.table({"x": pa.array([[1, 2]], pa.list_(value_type))})
    t = transform_from_spec({"pad_or_truncate": {"column": "x", "length": 4, "pad_value": pad_value}})
    with pytest.raises(SpecError, match=rf"PadOrTruncate: pad_value .* does not fit the list's value "
                                        rf"type {value_type} \(column 'x'\)"):
        t.output_schema(tbl.schema)
    with pytest.raises(SpecError, match=r"pad_value"):
        apply_transforms(tbl, [t])
