"""Pipeline spec validation: every error names the key and the allowed values."""

from __future__ import annotations

import collections.abc
import typing

import pytest

from slicefeed.connectors import SpecError
from slicefeed.pipelines import apply_overrides, fingerprint, load_spec, validate_spec

GOOD = {
    "name": "t",
    "source": {"format": "jsonl", "uri": "/data/raw"},
    "transforms": [{"select": {"columns": ["a"]}}],
    "sink": {"format": "parquet", "uri": "/data/out"},
}


def _with(**kw):
    spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in GOOD.items()}
    spec.update(kw)
    return spec


def test_good_spec_gets_defaults():
    spec = validate_spec(GOOD)
    assert spec["seed"] == 0 and spec["on_error"] == "fail" and spec["max_error_fraction"] == 0.0


@pytest.mark.parametrize(
    "spec, message",
    [
        (_with(sourc={}), r"unknown key 'sourc' in \(top level\); allowed keys: description, max_error_fraction, name, on_error, placement, seed, sink, source, sources, task_retries, transforms"),
        ({"name": "t"}, r"missing required key 'source'"),
        ({"source": GOOD["source"]}, r"missing required key 'name'"),
        (_with(seed="zero"), r"seed must be an integer, got string 'zero'"),
        (_with(source={"format": "xml", "uri": "x"}), r"source.format is 'xml'; allowed values: parquet, jsonl, csv, text, dataset"),
        (_with(source={"format": "jsonl", "uri": 3}), r"source.uri must be a string, got integer 3"),
        (_with(source={"format": "jsonl"}), r"missing required key 'uri' in source"),
        (_with(source={"format": "jsonl", "uri": "x", "options": {"colums": ["a"]}}), r"unknown option 'colums' in source.options for format 'jsonl'; allowed options: columns, shuffle_seed"),
        (_with(sink={"format": "csv", "uri": "x"}), r"sink.format is 'csv'; allowed values: parquet"),
        (_with(on_error="ignore"), r"on_error is 'ignore'; allowed values: fail, skip, quarantine"),
        (_with(transforms=[{"tokenise": {}}]), r"transforms.0: unknown transform 'tokenise'; allowed: .*select"),
        (_with(transforms=[{"select": {"cols": ["a"]}}]), r"transforms.0: select: unknown argument 'cols'; allowed arguments: columns"),
        (_with(transforms=[{"select": {}, "rename": {}}]), r"transforms.0 must be a mapping with exactly one key"),
        (_with(transforms="select"), r"transforms must be a list, got string"),
        ("just a string", r"must be a mapping with keys name, source, transforms, sink; got string"),
    ],
)
def test_errors_name_key_and_allowed_values(spec, message):
    with pytest.raises(SpecError, match=message):
        validate_spec(spec)


def test_overrides_set_nested_and_list_values():
    spec = apply_overrides(GOOD, ["sink.uri=/elsewhere", "seed=7", "transforms.0.select.columns=[a, b]"])
    assert spec["sink"]["uri"] == "/elsewhere" and spec["seed"] == 7
    assert spec["transforms"][0]["select"]["columns"] == ["a", "b"]
    assert GOOD["sink"]["uri"] == "/data/out", "overrides must not change the input"
    with pytest.raises(SpecError, match=r"--set 'nokey': expected key.path=value"):
        apply_overrides(GOOD, ["nokey"])
    with pytest.raises(SpecError, match=r"--set transforms.5.x: index 5 is out of range; the list has 1 items"):
        apply_overrides(GOOD, ["transforms.5.x=1"])


def test_load_spec_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML at line 3"):
        load_spec(bad)
    with pytest.raises(SpecError, match=r"pipeline spec '.*missing.yaml' does not exist"):
        load_spec(tmp_path / "missing.yaml")
    # safe_load: a Python object tag is refused, never constructed.
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(evil)


def test_fingerprint_ignores_sink_but_not_transforms():
    a = validate_spec(GOOD)
    b = validate_spec(_with(sink={"format": "parquet", "uri": "/other"}))
    c = validate_spec(_with(transforms=[{"select": {"columns": ["b"]}}]))
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


def _fp(**kw):
    spec = _with(**kw)
    if "sources" in kw:
        del spec["source"]
    return fingerprint(validate_spec(spec))


@pytest.mark.parametrize("a, b", [
    # Paths as the readers resolve them.
    ({"source": {"format": "jsonl", "uri": "gs://b/raw/"}},
     {"source": {"format": "jsonl", "uri": "gs://b/raw"}}),
    ({"source": {"format": "jsonl", "uri": "gcs://b/raw//"}},
     {"source": {"format": "jsonl", "uri": "gs://b/raw"}}),
    ({"source": {"format": "jsonl", "uri": "file:///data/./raw/"}},
     {"source": {"format": "jsonl", "uri": "/data/raw"}}),
    # Expressions by their parsed form.
    ({"transforms": [{"filter": {"expr": " a>1 and(b=='x')"}}]},
     {"transforms": [{"filter": {"expr": "a > 1 and b == \"x\""}}]}),
    # Defaults filled in, numbers in their declared type.
    ({"transforms": [{"standardize": {"columns": ["a"]}}]},
     {"transforms": [{"standardize": {"columns": ["a"], "dtype": "float32", "mean": None}}]}),
    ({"transforms": [{"random_flip": {"p": 1}}]}, {"transforms": [{"random_flip": {"p": 1.0}}]}),
    ({"transforms": [{"random_flip": {}}], "seed": 7},
     {"transforms": [{"random_flip": {"seed": 7}}], "seed": 7}),
    ({"source": {"format": "text", "uri": "/d"}},
     {"source": {"format": "text", "uri": "/d", "options": {"drop_empty_lines": False}}}),
    # CSV's delimiter is chosen by each file's name (tab for .tsv): writing the
    # default out means the same only where the URI fixes the names.
    ({"source": {"format": "csv", "uri": "/d/*.csv"}},
     {"source": {"format": "csv", "uri": "/d/*.csv", "options": {"delimiter": ","}}}),
    ({"source": {"format": "csv", "uri": "/d/a.tsv"}},
     {"source": {"format": "csv", "uri": "/d/a.tsv", "options": {"delimiter": "\t"}}}),
    # A mixture's unnamed source is named by its index; weights are numbers.
    ({"sources": [{"format": "jsonl", "uri": "/a"}, {"format": "jsonl", "uri": "/b", "weight": 2}]},
     {"sources": [{"format": "jsonl", "uri": "/a", "name": "0", "weight": 1},
                  {"format": "jsonl", "uri": "/b", "name": "1", "weight": 2.0}]}),
    # A lone source's mixture weight and name change nothing.
    ({"source": {"format": "jsonl", "uri": "/a", "weight": 3, "name": "x"}},
     {"source": {"format": "jsonl", "uri": "/a"}}),
], ids=["gs-trailing-slash", "gcs-scheme", "file-uri", "expr-spacing", "transform-defaults",
        "int-for-float", "random-seed-default", "text-option-default", "csv-glob-delimiter",
        "tsv-file-delimiter", "mixture-defaults", "lone-source-weight"])
def test_fingerprint_is_of_what_the_spec_means(a, b):
    assert _fp(**a) == _fp(**b)


@pytest.mark.parametrize("a, b", [
    ({"source": {"format": "jsonl", "uri": "gs://b/raw"}},
     {"source": {"format": "jsonl", "uri": "gs://b/raw2"}}),
    # On GCS "raw//a" and "raw/a" are two object names.
    ({"source": {"format": "jsonl", "uri": "gs://b/raw/*.jsonl"}},
     {"source": {"format": "jsonl", "uri": "gs://b/raw//*.jsonl"}}),
    ({"transforms": [{"filter": {"expr": "a > 1"}}]}, {"transforms": [{"filter": {"expr": "a > 2"}}]}),
    ({"transforms": [{"filter": {"expr": "a > 1"}}]}, {"transforms": [{"filter": {"expr": "a > 1.0"}}]}),
    ({"transforms": [{"filter": {"expr": "a > 1"}}]}, {"transforms": [{"filter": {"expr": "a >= 1"}}]}),
    # Column names as written: Python would fold "\ufb01" (the fi ligature) to "fi".
    ({"transforms": [{"filter": {"expr": "\ufb01 > 1"}}]},
     {"transforms": [{"filter": {"expr": "fi > 1"}}]}),
    ({"transforms": [{"filter": {"expr": "a == 'x'"}}]},
     {"transforms": [{"filter": {"expr": "a == 'x '"}}]}),
    ({"transforms": [{"random_flip": {}}], "seed": 7},
     {"transforms": [{"random_flip": {"seed": 8}}], "seed": 7}),
    ({"transforms": [{"pad_or_truncate": {"column": "t", "length": 4, "pad_value": 0}}]},
     {"transforms": [{"pad_or_truncate": {"column": "t", "length": 4, "pad_value": 0.5}}]}),
    ({"source": {"format": "text", "uri": "/d"}},
     {"source": {"format": "text", "uri": "/d", "options": {"drop_empty_lines": True}}}),
    # A folder's .tsv files are read with tabs unless a delimiter is given.
    ({"source": {"format": "csv", "uri": "/d"}},
     {"source": {"format": "csv", "uri": "/d", "options": {"delimiter": ","}}}),
    ({"source": {"format": "csv", "uri": "/d/a.tsv"}},
     {"source": {"format": "csv", "uri": "/d/a.tsv", "options": {"delimiter": ","}}}),
    ({"sources": [{"format": "jsonl", "uri": "/a"}, {"format": "jsonl", "uri": "/b"}]},
     {"sources": [{"format": "jsonl", "uri": "/a"}, {"format": "jsonl", "uri": "/b", "weight": 2}]}),
    ({"sources": [{"format": "jsonl", "uri": "/a"}, {"format": "jsonl", "uri": "/b"}]},
     {"sources": [{"format": "jsonl", "uri": "/a", "name": "x"}, {"format": "jsonl", "uri": "/b"}]}),
    ({"max_error_fraction": 0}, {"max_error_fraction": 0.01}),
], ids=["source-uri", "gcs-doubled-slash", "filter-constant", "filter-literal-type", "filter-operator", "nfkc-name",
        "string-literal", "random-seed", "pad-value", "text-option", "csv-folder-delimiter",
        "tsv-file-comma", "mixture-weight", "mixture-name", "error-fraction"])
def test_fingerprint_tells_apart_what_can_change_a_value(a, b):
    assert _fp(**a) != _fp(**b)


def test_fingerprint_tells_a_yaml_timestamp_from_the_string_that_prints_it():
    """YAML reads ``2024-01-01 10:00:00`` unquoted as a timestamp and quoted as a
    string, and fill_null writes them differently into a string column, so the
    two specs are two pipelines (their JSON text was the same). A mapping key
    that is not a string is fingerprinted, not a crash."""
    import pyarrow as pa

    from slicefeed.pipelines._spec import safe_load_yaml
    from slicefeed.transforms import transform_from_spec

    def spec(value: str) -> dict:
        return _with(transforms=safe_load_yaml(f"[fill_null: {{values: {{t: {value}}}}}]"))

    stamp, text = spec("2024-01-01 10:00:00"), spec("'2024-01-01 10:00:00'")
    table = pa.table({"t": pa.array([None], pa.string())})
    written = [transform_from_spec(s["transforms"][0])(table)["t"][0].as_py() for s in (stamp, text)]
    assert written[0] != written[1]
    assert fingerprint(validate_spec(stamp)) != fingerprint(validate_spec(text))
    assert fingerprint(validate_spec(spec("!!binary aGk="))) != fingerprint(validate_spec(spec("\"b'hi'\"")))
    keys = [fingerprint(validate_spec(spec(v))) for v in ("{1: 2, b: 3}", "{'1': 2, b: 3}")]
    assert keys[0] != keys[1]


def test_filter_fingerprint_form_is_the_same_on_every_python_version():
    """A filter is fingerprinted by its syntax tree in one written form, pinned
    here: ``ast.dump`` leaves out empty lists from Python 3.13 on, so its text
    for ``is_null(x)`` changed with the interpreter, and a rerun after
    upgrading Python was refused as another pipeline."""
    from slicefeed.transforms._expr import canonical_expression

    assert canonical_expression("is_null( x )") == (
        "Call(func=Name(id='is_null', ctx=Load()), args=[Name(id='x', ctx=Load())])")
    assert canonical_expression("x in []") == (
        "Compare(left=Name(id='x', ctx=Load()), ops=[In()], comparators=[List(ctx=Load())])")


def test_scaler_statistic_beyond_float_range_is_a_spec_error():
    """A min/max (or mean/std) given as an integer float64 cannot hold is refused
    naming the argument and column, not an OverflowError out of validate_spec."""
    spec = _with(transforms=[{"min_max_scale": {"columns": ["a"], "min": {"a": 10**400},
                                                "max": {"a": 1}}}])
    with pytest.raises(SpecError, match=r"transforms.0: MinMaxScale: min for column 'a' must be a "
                                        r"finite number; got an integer of 1329 bits"):
        validate_spec(spec)


@pytest.mark.parametrize("salt", [None, 2024, True])
def test_hash_bucket_salt_that_is_not_a_string_is_a_spec_error(salt):
    """YAML reads ``salt:`` as null and ``salt: 2024`` as a number; validate_spec
    accepted them and every batch then failed inside a worker (a str + int)."""
    spec = _with(transforms=[{"hash_bucket": {"column": "a", "num_buckets": 4, "salt": salt}}])
    with pytest.raises(SpecError, match=r"transforms.0: HashBucket: argument 'salt' must be a string; got "):
        validate_spec(spec)


def test_decode_image_exif_orientation_is_checked_and_in_the_fingerprint():
    """exif_orientation changes pixel values, so it is part of the fingerprint; a spec
    that does not name it keeps its fingerprint (and its output: the default is
    "ignore", the decode before the option existed)."""
    images = {"format": "parquet", "uri": "/data/images"}

    def spec(**args):
        return validate_spec(_with(source=images, transforms=[{"decode_image": args}]))

    plain, applied = spec(), spec(exif_orientation="apply")
    assert fingerprint(plain) != fingerprint(applied)
    assert fingerprint(plain) == fingerprint(spec())
    assert fingerprint(applied) != fingerprint(spec(exif_orientation="ignore"))
    # An option whose default keeps the earlier output is left out of the
    # fingerprint at its default, so adding it changed no existing pipeline's.
    from slicefeed.transforms import transform_from_spec

    assert "exif_orientation" not in transform_from_spec(
        {"decode_image": {"column": "img", "exif_orientation": "ignore"}}).fingerprint_spec()["decode_image"]
    with pytest.raises(SpecError, match=r"transforms.0: DecodeImage: unknown exif_orientation 'rotate'; "
                                        r"allowed: ignore, apply"):
        spec(exif_orientation="rotate")


def test_uri_templates_date_datetime_env():
    import datetime as dt

    from slicefeed.pipelines import Pipeline, expand_uri_templates

    spec = validate_spec(_with(
        source={"format": "parquet", "uri": "gs://b/raw/{date}/*.parquet"},
        sink={"format": "parquet", "uri": "gs://b/{env:SF_TEAM}/out/{date}/{datetime}"}))
    out = expand_uri_templates(spec, when="2026-01-02", env={"SF_TEAM": "nlp"})
    assert out["source"]["uri"] == "gs://b/raw/2026-01-02/*.parquet"
    assert out["sink"]["uri"] == "gs://b/nlp/out/2026-01-02/20260102T000000Z"
    assert spec["sink"]["uri"].endswith("{date}/{datetime}"), "the input is not changed"
    # Default: the run's UTC date.
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    out = expand_uri_templates(spec, env={"SF_TEAM": "x"})
    assert out["sink"]["uri"].startswith(f"gs://b/x/out/{today}/{today.replace('-', '')}T")
    with pytest.raises(SpecError, match=r"sink.uri uses \{env:SF_TEAM\} but the environment "
                                        "variable SF_TEAM is not set"):
        expand_uri_templates(spec, env={})
    with pytest.raises(SpecError, match=r"--date '2026-1-2': expected YYYY-MM-DD"):
        expand_uri_templates(spec, when="2026-1-2", env={"SF_TEAM": "x"})
    typo = _with(sink={"format": "parquet", "uri": "gs://b/out/{dat}"})
    with pytest.raises(SpecError, match=r"unknown placeholder '\{dat\}'; allowed: \{date\}"):
        Pipeline(typo, date="2026-01-02")
    # A Pipeline fills them (the sink a scheduled run commits to); the fingerprint sees the
    # filled source.
    p = Pipeline(_with(sink={"format": "parquet", "uri": "/data/out/{date}"}), date="2026-03-04")
    assert p.spec["sink"]["uri"] == "/data/out/2026-03-04"


@pytest.mark.parametrize("step, argument, want", [
    ('random_flip: {horizontal: "false", vertical: true}', "horizontal", "true or false"),
    ("tokenize: {add_eos: 'no'}", "add_eos", "true or false"),
    ("pad_or_truncate: {column: tokens, length: 8, mask: 1}", "mask", "true or false"),
    ('random_crop: {height: 2, width: 2, seed: "7"}', "seed", "an integer or null"),
    ("random_flip: {seed: 1.5}", "seed", "an integer or null"),
    ("vocabulary: {column: tag, min_count: true}", "min_count", "an integer"),
    ("random_flip: {p: true}", "p", "a number"),
    ("rename: {mapping: {a: 1}}", "mapping", "a mapping of strings to strings"),
    ("select: {columns: [a, 2]}", "columns", "a list of strings(?=; got .*, where item 1 is 2)"),
    ("hash_bucket: {column: 1, num_buckets: 4}", "column", "a string"),
    ("vocabulary: {column: tag, vocab: abc}", "vocab", "a list of values or null"),
])
def test_transform_argument_of_another_type_is_refused_at_validation(tmp_path, step, argument, want):
    """A YAML value of another type than the argument declares was kept as given:
    ``horizontal: "false"`` (quoted) is a non-empty string, so every image was
    flipped; ``seed: "7"`` and ``seed: 7`` gave the same rows under two
    fingerprints. Validation now names the argument, what it takes and what it got."""
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nsource: {format: jsonl, uri: /tmp/in.jsonl}\nsink: {format: parquet, uri: /tmp/out}\n"
                    f"transforms:\n  - {step}\n")
    with pytest.raises(SpecError, match=rf"transforms\.0: \w+: argument '{argument}' must be {want}; got "):
        validate_spec(load_spec(path))


@pytest.mark.parametrize("written, value", [
    ("NO", "NO"), ("no", "no"), ("on", "on"), ("Off", "Off"), ("y", "y"), ("yes", "yes"),
    ("12:30", "12:30"), ("1:20:00.5", "1:20:00.5"), ("010", "010"), ("-007", "-007"),
    ("0b101", "0b101"),
    ("true", True), ("False", False), ("TRUE", True), ("0", 0), ("-12", -12), ("1_000", 1000),
    ("0o17", 15), ("0x1F", 31), ("1e3", 1000.0), ("-2.5E-1", -0.25), (".5", 0.5),
    ("1.", 1.0), ("+.5e1", 5.0), ("~", None), ("null", None),
])
def test_spec_yaml_reads_scalars_as_yaml_1_2_does(tmp_path, written, value):
    """PyYAML reads YAML 1.1: `country: NO` (Norway) was false, `on` true,
    `12:30` the number 750 and `010` the number 8, and `fill_null` wrote those
    into a text column as 'false', 'true', '750' and '8'. The spec loader reads
    YAML 1.2's core schema: only true/false are booleans, no base-60 numbers, no
    leading-zero octal; what is not a YAML 1.2 number or boolean is the text
    written."""
    from slicefeed.transforms import transform_from_spec

    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nsource: {format: jsonl, uri: /tmp/in.jsonl}\n"
                    "sink: {format: parquet, uri: /tmp/out}\n"
                    f"transforms:\n  - fill_null: {{values: {{c: {written}}}}}\n")
    got = load_spec(path)["transforms"][0]["fill_null"]["values"]["c"]
    assert got == value and type(got) is type(value)
    if isinstance(value, str):
        import pyarrow as pa

        table = pa.table({"c": pa.array([None, "x"], pa.string())})
        fill = transform_from_spec(validate_spec(load_spec(path))["transforms"][0])
        assert fill(table)["c"].to_pylist() == [written, "x"]


def test_yaml_1_1_boolean_for_a_flag_is_refused_with_true_or_false_as_the_fix(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nsource: {format: jsonl, uri: /tmp/in.jsonl}\n"
                    "sink: {format: parquet, uri: /tmp/out}\n"
                    "transforms:\n  - random_flip: {column: image, horizontal: off}\n")
    with pytest.raises(SpecError, match=r"argument 'horizontal' must be true or false; got 'off' \(a string\); "
                                        r"write true or false \(YAML 1\.2 reads yes/no/on/off as text\)"):
        validate_spec(load_spec(path))


def test_transform_arguments_of_their_declared_types_pass_and_ints_are_numbers(tmp_path):
    """The check refuses only other types: an integer where a number is declared
    is that number, numpy scalars are the plain numbers they hold (one
    fingerprint, a YAML-ready to_spec), and ``1e3`` in YAML is a number (YAML
    1.2; PyYAML alone reads it as text)."""
    import dataclasses

    import numpy as np
    import yaml

    from slicefeed.transforms import RandomFlip, Transform, transform_from_spec
    assert transform_from_spec({"random_flip": {"p": 1, "seed": 3}}).p == 1
    flip = RandomFlip(p=np.float32(0.25), seed=np.int64(3), vertical=np.bool_(True))
    assert (type(flip.p), type(flip.seed), type(flip.vertical)) == (float, int, bool)
    assert flip.fingerprint_spec() == RandomFlip(p=0.25, seed=3, vertical=True).fingerprint_spec()
    yaml.safe_dump(flip.to_spec())
    with pytest.raises(SpecError, match=r"RandomFlip: argument 'horizontal' must be true or false; got 'no'"):
        RandomFlip(horizontal="no")
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nsource: {format: jsonl, uri: /tmp/in.jsonl}\n"
                    "sink: {format: parquet, uri: /tmp/out}\n"
                    "transforms:\n  - standardize: {columns: [p], mean: {p: 1e3}, std: {p: 2.5e-1}}\n")
    step = validate_spec(load_spec(path))["transforms"][0]["standardize"]
    assert step["mean"] == {"p": 1000.0} and step["std"] == {"p": 0.25}

    @dataclasses.dataclass(frozen=True)
    class Pair(Transform):  # a fixed-length tuple: each place its own type
        size: tuple[int, str] = (1, "a")

    assert Pair().size == (1, "a")
    with pytest.raises(SpecError, match=r"argument 'size' must be .*, where item 1 is 2"):
        Pair(size=(1, 2))

    class Mode:  # known only here: its annotation does not resolve from the module
        pass

    @dataclasses.dataclass(frozen=True)
    class Local(Transform):  # the other arguments are checked all the same
        flag: bool = False
        mode: Mode | None = None
        kind: typing.Literal["a", "b"] = "a"
        weights: collections.abc.Mapping[str, float] = dataclasses.field(default_factory=dict)

    with pytest.raises(SpecError, match=r"argument 'flag' must be true or false; got 'false'"):
        Local(flag="false")
    with pytest.raises(SpecError, match=r"argument 'kind' must be one of 'a', 'b'; got 5"):
        Local(kind=5)
    with pytest.raises(SpecError, match=r"argument 'weights' must be a mapping of strings to numbers"):
        Local(weights={"w": "x"})
    assert Local(kind="b", weights={"w": 1}).kind == "b"


def test_a_reader_option_added_later_changes_no_fingerprint(monkeypatch):
    """Reader options were all written into the fingerprint with their defaults,
    so giving a format one more option (whose default reads as before) would
    have changed the fingerprint of every pipeline of that format, and each
    committed dataset would be recomputed or refused. Such an option now counts
    only where given and not at its default; the options fingerprints already
    hold keep their form (these digests are pinned)."""
    import dataclasses

    from slicefeed.connectors._formats import FORMATS

    tsv = validate_spec(_with(source={"format": "csv", "uri": "/data/in/a.tsv"}))
    text = validate_spec(_with(source={"format": "text", "uri": "/data/in", "options": {"shuffle_seed": 3}},
                               transforms=[{"select": {"columns": ["text"]}}]))
    pinned = {"tsv": "6f14fecf50771f60f01708fdcd7d203706ad8c7c9a59819f5aa84bd4716588e7",
              "text": "e39e068982fe12b385e42e3abe0fb18ac461d26daeee20f4dcfc15a693dfd7e4"}
    assert {"tsv": fingerprint(tsv), "text": fingerprint(text)} == pinned
    csv = FORMATS["csv"]
    monkeypatch.setitem(FORMATS, "csv", dataclasses.replace(csv, options={**csv.options, "quote": '"'}))
    assert fingerprint(tsv) == pinned["tsv"]
    at_default = {**tsv, "source": {**tsv["source"], "options": {"quote": '"'}}}
    other = {**tsv, "source": {**tsv["source"], "options": {"quote": "'"}}}
    assert fingerprint(at_default) == pinned["tsv"]
    assert fingerprint(other) != pinned["tsv"]
