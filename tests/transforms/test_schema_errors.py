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
