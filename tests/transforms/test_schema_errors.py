"""Every registered transform names itself, the missing column and the available ones."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from slicefeed.connectors import SpecError
from slicefeed.transforms import TRANSFORMS, get_transform, transform_from_spec

# Minimal arguments that point every transform at a column the schema lacks.
MISSING = {
    "select": {"columns": ["nope"]},
    "rename": {"mapping": {"nope": "x"}},
    "cast": {"columns": {"nope": "int32"}},
    "filter": {"expr": "nope > 1"},
    "fill_null": {"values": {"nope": 0}},
    "standardize": {"columns": ["nope"]},
    "min_max_scale": {"columns": ["nope"]},
    "hash_bucket": {"column": "nope", "num_buckets": 4},
    "vocabulary": {"column": "nope"},
    "deduplicate": {"columns": ["nope"]},
    "tokenize": {"column": "nope"},
    "pad_or_truncate": {"column": "nope", "length": 4},
    "pack_sequences": {"column": "nope", "seq_len": 8},
    "decode_image": {"column": "nope"},
    "resize": {"column": "nope", "height": 2, "width": 2},
    "center_crop": {"column": "nope"},
    "random_crop": {"column": "nope"},
    "random_flip": {"column": "nope"},
    "normalize_image": {"column": "nope"},
}

SCHEMA = pa.schema([("text", pa.string()), ("id", pa.int64()), ("_sf_file", pa.string()), ("_sf_row", pa.int64())])


def test_every_transform_is_covered():
    # Only the built-in ones: tests may register their own (tests/pipelines/_stall_transform.py).
    builtin = {n for n, cls in TRANSFORMS.items() if cls.__module__.startswith("slicefeed.transforms")}
    assert set(MISSING) == builtin


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_column_message(name):
    t = transform_from_spec({name: MISSING[name]})
    cls = type(t).__name__
    with pytest.raises(SpecError, match=rf"^{cls}: column 'nope' not found; available: text, id\. Fix the '\w+' argument\.$"):
        t.output_schema(SCHEMA)


@pytest.mark.parametrize("name", sorted(MISSING))
def test_unknown_argument_lists_allowed(name):
    fields = [f.name for f in dataclasses.fields(get_transform(name))]
    with pytest.raises(SpecError, match=rf"^{name}: unknown argument 'colour'; allowed arguments: {fields[0]}"):
        transform_from_spec({name: {**MISSING[name], "colour": 1}})


# -- hostile sizes: messages quote user values bounded ------------------------------

_HUGE = "x" * 1_000_000  # a spec value
_NAME = "n" * 1_000_000  # a column name, as data or a spec may bring it
_HOSTILE_SCHEMA = pa.schema([
    ("c", pa.int64()), ("s", pa.string()), ("f", pa.float64()),
    ("tokens", pa.list_(pa.int32())), ("image", pa.binary()),
    (_NAME + "_int", pa.int64()), (_NAME + "_str", pa.string()),
    (_NAME + "_list", pa.list_(pa.int32())), (_NAME + "_bin", pa.binary()),
    ("m" * 90_000, pa.string()),  # a name that fits in a filter expression
    ("_sf_file", pa.string()), ("_sf_row", pa.int64()),
])
_BIG_INT = 1 << 20_000  # beyond Python's int-to-str digit limit

# (transform spec, what the message must name: the transform and the argument).
# Each message comes from building the transform, checking it against
# _HOSTILE_SCHEMA, or applying it to one row of that schema.
HOSTILE_CASES = {
    "fill_null value": ({"fill_null": {"values": {"c": _HUGE}}}, ["FillNull", "fill value", "'c'"]),
    "cast type": ({"cast": {"columns": {"c": _HUGE}}}, ["Cast", "unknown type", "column 'c'"]),
    "cast huge column": ({"cast": {"columns": {_NAME + "_int": "date32"}}}, ["Cast", "cannot cast column 'nnn"]),
    "rename value": ({"rename": {"mapping": {"c": 5, "s": _HUGE}}}, ["Rename", "mapping"]),
    "rename collision": ({"rename": {"mapping": {"c": _NAME + "_str"}}}, ["Rename", "collides"]),
    "select": ({"select": {"columns": ["c", _HUGE]}}, ["Select", "not found", "columns"]),
    "filter literal list": ({"filter": {"expr": "c in [d" + "e" * 90_000 + " + 1]"}},
                            ["Filter", "inside a literal list"]),
    "filter function": ({"filter": {"expr": "f" * 90_000 + "(c) > 0"}}, ["Filter", "function"]),
    "filter huge column": ({"filter": {"expr": f"col('{'m' * 90_000}') > 1"}}, ["Filter", "type-check"]),
    "pack strategy": ({"pack_sequences": {"strategy": _HUGE}}, ["PackSequences", "strategy"]),
    "pack overflow": ({"pack_sequences": {"overflow": [_HUGE]}}, ["PackSequences", "overflow"]),
    "pack seq_len": ({"pack_sequences": {"seq_len": _HUGE}}, ["PackSequences", "seq_len"]),
    "pack huge column": ({"pack_sequences": {"column": _NAME + "_int"}}, ["PackSequences", "column 'nnn"]),
    "tokenize bos_token": ({"tokenize": {"column": "s", "add_bos": True, "bos_token": _HUGE}},
                           ["Tokenize", "bos_token"]),
    "tokenize output": ({"tokenize": {"column": "s", "output": {_HUGE: 1}}}, ["Tokenize", "output"]),
    "tokenize max_length": ({"tokenize": {"column": "s", "max_length": _HUGE}}, ["Tokenize", "max_length"]),
    "tokenize tokenizer": ({"tokenize": {"column": "s", "tokenizer": "/" + _HUGE, "max_length": 8}},
                           ["Tokenize", "tokenizer file"]),
    "tokenize huge column": ({"tokenize": {"column": _NAME + "_int"}}, ["Tokenize", "column 'nnn"]),
    "vocabulary vocab": ({"vocabulary": {"column": "c", "vocab": [_HUGE]}}, ["Vocabulary", "vocab"]),
    "vocabulary top_k": ({"vocabulary": {"column": "c", "top_k": _HUGE}}, ["Vocabulary", "top_k"]),
    "vocabulary huge column": ({"vocabulary": {"column": _NAME + "_bin", "vocab": [1]}},
                               ["Vocabulary", "column 'nnn"]),
    "hash_bucket num_buckets": ({"hash_bucket": {"column": "c", "num_buckets": _HUGE}},
                                ["HashBucket", "num_buckets"]),
    "hash_bucket huge column": ({"hash_bucket": {"column": _NAME + "_list", "num_buckets": 4}},
                                ["HashBucket", "column 'nnn"]),
    "deduplicate huge column": ({"deduplicate": {"columns": [_NAME + "_list"]}}, ["Deduplicate", "column 'nnn"]),
    "decode_image mode": ({"decode_image": {"mode": _HUGE}}, ["DecodeImage", "mode"]),
    "decode_image resample": ({"decode_image": {"resample": _HUGE}}, ["DecodeImage", "resample"]),
    "decode_image root": ({"decode_image": {"root": [_HUGE]}}, ["DecodeImage", "root"]),
    "decode_image draft": ({"decode_image": {"draft": _HUGE}}, ["DecodeImage", "draft"]),
    "decode_image exif_orientation": ({"decode_image": {"exif_orientation": _HUGE}},
                                      ["DecodeImage", "exif_orientation"]),
    "decode_image max_pixels": ({"decode_image": {"max_pixels": _HUGE}}, ["DecodeImage", "max_pixels"]),
    "decode_image huge column": ({"decode_image": {"column": _NAME + "_int"}}, ["DecodeImage", "column 'nnn"]),
    "resize resample": ({"resize": {"height": 2, "width": 2, "resample": _HUGE}}, ["Resize", "resample"]),
    "resize height": ({"resize": {"height": _HUGE, "width": 2}}, ["Resize", "height"]),
    "resize huge column": ({"resize": {"column": _NAME + "_int", "height": 2, "width": 2}},
                           ["Resize", "column 'nnn"]),
    "center_crop huge column": ({"center_crop": {"column": _NAME + "_int"}}, ["CenterCrop", "column 'nnn"]),
    "random_flip p": ({"random_flip": {"p": _HUGE}}, ["RandomFlip", "'p' must"]),
    "normalize mean": ({"normalize_image": {"mean": _HUGE}}, ["NormalizeImage", "mean"]),
    "normalize std": ({"normalize_image": {"std": [_HUGE]}}, ["NormalizeImage", "std"]),
    "normalize dtype": ({"normalize_image": {"dtype": _HUGE}}, ["NormalizeImage", "dtype"]),
    "standardize dtype": ({"standardize": {"columns": ["f"], "dtype": _HUGE}}, ["Standardize", "dtype"]),
    "standardize columns": ({"standardize": {"columns": [_HUGE], "mean": {"f": 0}, "std": {"f": 1}}},
                            ["Standardize", "mean"]),
    "min_max_scale dtype": ({"min_max_scale": {"columns": ["f"], "dtype": _HUGE}}, ["MinMaxScale", "dtype"]),
    "pad side": ({"pad_or_truncate": {"column": "tokens", "length": 4, "side": _HUGE}},
                 ["PadOrTruncate", "side"]),
    "pad length": ({"pad_or_truncate": {"column": "tokens", "length": _BIG_INT}}, ["PadOrTruncate", "length"]),
    "pad huge column": ({"pad_or_truncate": {"column": _NAME + "_int", "length": 4}},
                        ["PadOrTruncate", "column 'nnn"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CASES))
def test_messages_quote_huge_spec_values_and_column_names_bounded(case):
    """A huge spec value or column name is quoted cut (short_repr/printable), never
    whole: every message stays short and still names the transform and argument."""
    spec, names = HOSTILE_CASES[case]
    row = pa.table({f.name: pa.array([None], f.type) for f in _HOSTILE_SCHEMA})
    with pytest.raises(Exception) as info:  # SpecError, or the tokenizer file's OSError
        t = transform_from_spec(spec)
        t.output_schema(_HOSTILE_SCHEMA)
        t(row)
    msg = str(info.value)
    assert len(msg) < 2_000, (case, len(msg), msg[:300])
    for name in names:
        assert name in msg, (case, name, msg[:300])


@pytest.mark.parametrize("spec", [
    {"cast": {"columns": {"_sf_row": "int8"}}},
    {"fill_null": {"values": {"_sf_row": 0}}},
    {"standardize": {"columns": ["_sf_row"], "mean": {"_sf_row": 0.0}, "std": {"_sf_row": 1.0}}},
    {"hash_bucket": {"column": "_sf_file", "num_buckets": 4}},
    {"vocabulary": {"column": "_sf_file", "vocab": ["a"]}},
])
def test_transforms_refuse_to_change_slicefeed_own_columns_in_place(spec):
    """`cast: {_sf_row: int8}` passed validation and then quarantined valid
    rows (row numbers past 127 do not fit int8) with their row identity
    nulled. A transform that would change slicefeed's own columns in place is
    refused by the schema check; reading them into a column of one's own is
    allowed (`hash_bucket` of `_sf_file` into `split`)."""
    schema = pa.schema([("x", pa.int64()), ("_sf_file", pa.string()), ("_sf_row", pa.int64())])
    with pytest.raises(SpecError, match=r"'_sf_(row|file)' is slicefeed's own column"):
        transform_from_spec(spec).output_schema(schema)
    ok = transform_from_spec({"hash_bucket": {"column": "_sf_file", "num_buckets": 4,
                                              "output": "split"}}).output_schema(schema)
    assert ok.field("split").type == pa.int32() and ok.field("_sf_file").type == pa.string()


@pytest.mark.parametrize("column, value", [("flag", 2), ("flag", 1), ("flag", "yes"), ("n", True)])
def test_fill_null_refuses_a_bool_for_another_type_and_another_type_for_bool(column, value):
    """``fill_null: {flag: 2}`` on a bool column filled True (Arrow casts any
    nonzero number to True). A bool column is filled with true/false only, and
    true/false fills only a bool column: between bool and other kinds a cast
    changes the value's meaning, not only its type."""
    schema = pa.schema([("flag", pa.bool_()), ("n", pa.int64())])
    fill = transform_from_spec({"fill_null": {"values": {column: value}}})
    with pytest.raises(SpecError, match=rf"^FillNull: fill value {value!r} for column '{column}' is "
                                        r"(not true/false|true/false); the column is (bool|int64)\. "):
        fill.output_schema(schema)
    ok = transform_from_spec({"fill_null": {"values": {"flag": False, "n": 0}}})
    assert ok.output_schema(schema) == schema
    table = pa.table({"flag": pa.array([None, True]), "n": pa.array([None, 3], pa.int64())})
    assert ok(table).to_pylist() == [{"flag": False, "n": 0}, {"flag": True, "n": 3}]


@pytest.mark.parametrize("spec", [
    {"hash_bucket": {"column": "text", "num_buckets": 4, "output": "_sf_row"}},
    {"vocabulary": {"column": "text", "vocab": ["a"], "output": "_sf_file"}},
    {"tokenize": {"column": "text", "output": "_sf_error"}},
    {"pad_or_truncate": {"column": "ids", "length": 2, "output": "_sf_error"}},
])
def test_transforms_refuse_an_output_named_as_slicefeed_own_column(spec):
    """`hash_bucket {output: _sf_row}` passed validation, then overwrote every
    row's identity with its bucket (the bucket column never reached the
    dataset, and later errors named the wrong rows); `output: _sf_error`
    marked every row bad with its padded list as the reason. An ``output``
    naming one of slicefeed's own columns is refused when the transform is
    built, before any schema is known."""
    with pytest.raises(SpecError, match=r"output '_sf_(row|file|error)' is slicefeed's own column"):
        transform_from_spec(spec)


@pytest.mark.parametrize("spec, message", [
    ({"tokenize": {"add_bos": True, "bos_token": 2**40}}, r"bos_token 1099511627776 is not a token id"),
    ({"tokenize": {"add_eos": True, "eos_token": -1}}, r"eos_token -1 is not a token id"),
    ({"pack_sequences": {"seq_len": 2**40}}, r"seq_len must be at most 1048576"),
])
def test_token_ids_and_lengths_out_of_range_are_refused_when_built(spec, message):
    """`bos_token: 2**40` passed validation and the run then failed with a bare
    OverflowError; `seq_len: 2**40` failed the schema check with Arrow's
    message and a run with a 4 TiB allocation."""
    with pytest.raises(SpecError, match=message):
        transform_from_spec(spec)
