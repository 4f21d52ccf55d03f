"""The format registry: readers, peek_schema, inspect, validate, the spec and the CLI agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from slicefeed.connectors import peek_schema, read_csv
from slicefeed.connectors._formats import FORMATS

CLI = [sys.executable, "-m", "slicefeed.pipelines._ops.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _validated_columns(stdout: str) -> list[str]:
    """Column names from ``slicefeed validate``'s "output schema:" listing."""
    lines = stdout.split("output schema:\n", 1)[1].splitlines()
    return [ln.strip().split(":")[0] for ln in lines if ln.startswith("  ")]


def _spec(tmp_path, source: dict) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "fmt", "source": source}))
    return str(path)


def test_tsv_gives_the_same_three_columns_everywhere(ray_cluster, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "data.tsv").write_text("a\tb\tc\n1\t2\t3\n4\t5\t6\n")
    want = ["a", "b", "c"]

    assert read_csv(str(raw)).schema().names == want
    assert peek_schema("csv", str(raw)).names == want

    r = _cli("inspect", str(raw), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert list(info["schema"]) == want and info["num_rows"] == 2

    r = _cli("validate", _spec(tmp_path, {"format": "csv", "uri": str(raw)}))
    assert r.returncode == 0, r.stderr
    assert _validated_columns(r.stdout) == want


def test_spec_delimiter_is_honoured_by_validate_as_by_run(ray_cluster, tmp_path):
    from slicefeed.pipelines import Pipeline

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "data.csv").write_text("a;b;c\n1;2;3\n")
    source = {"format": "csv", "uri": str(raw), "options": {"delimiter": ";"}}

    r = _cli("validate", _spec(tmp_path, source))
    assert r.returncode == 0, r.stderr
    assert _validated_columns(r.stdout) == ["a", "b", "c"]

    p = Pipeline({"name": "fmt", "source": source})
    assert p.check().names == ["a", "b", "c"]
    assert p.dataset().schema().names == ["a", "b", "c"]  # what `run` writes


def _write_sample(fmt: str, folder) -> str:
    """Two rows in a file named as the format's first suffix; a new format needs a case here."""
    path = str(folder / f"sample{FORMATS[fmt].suffixes[0]}")
    if fmt == "parquet":
        pq.write_table(pa.table({"a": [1, 2]}), path)
    elif fmt == "jsonl":
        Path(path).write_text('{"a": 1}\n{"a": 2}\n')
    elif fmt == "csv":
        Path(path).write_text("a\n1\n2\n")
    elif fmt == "text":
        Path(path).write_text("one\ntwo\n")
    else:
        pytest.fail(f"format {fmt!r} has no sample in this test; add one")
    return path


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_registry_format_is_accepted_by_spec_cli_and_inspect(fmt, tmp_path):
    from slicefeed.pipelines import validate_spec
    from slicefeed.pipelines._ops.cli import build_parser
    from slicefeed.pipelines._ops.inspect import inspect_uri

    path = _write_sample(fmt, tmp_path)
    spec = validate_spec({"name": "x", "source": {"format": fmt, "uri": path}})
    assert spec["source"]["format"] == fmt
    for option in FORMATS[fmt].spec_options:  # every option the registry names is accepted
        value = {"columns": ["a"], "shuffle_seed": 1}.get(option, FORMATS[fmt].options.get(option))
        validate_spec({"name": "x", "source": {"format": fmt, "uri": path, "options": {option: value}}})
    args = build_parser().parse_args(["inspect", path, "--format", fmt])
    assert args.format == fmt
    for given in (fmt, "auto"):
        info = inspect_uri(path, fmt=given)
        assert info["num_rows"] == 2 and fmt in info["kind"], (given, info)
    assert peek_schema(fmt, path).names == list(info["schema"])


def test_read_json_text_keeps_strings_and_the_types_a_caller_gives():
    """Strings that look like times stay strings (pyarrow would type them as
    timestamps); a field the caller's schema types keeps that type."""
    import pyarrow as pa

    from slicefeed.connectors._formats import read_json_text

    data = b'{"a": "2024-01-01", "b": "2024-01-02T10:00:00+05:00", "c": [{"d": "2024-01-03"}]}\n'
    assert read_json_text(data).to_pylist() == [
        {"a": "2024-01-01", "b": "2024-01-02T10:00:00+05:00", "c": [{"d": "2024-01-03"}]}]
    table = read_json_text(data, pa.schema([("a", pa.timestamp("s"))]))
    assert table.schema.field("a").type == pa.timestamp("s")
    assert table.schema.field("b").type == pa.string()


_NULL_AT_A_BLOCK_START = r"""
import sys
from slicefeed.connectors._formats import read_json_text
import pyarrow as pa
before = sys.argv[1].encode()
record = b'{"a":1}\n'
room = (1 << 20) - len(before) - 1  # `before` ends pyarrow's first 1 MiB block
n, pad = divmod(room, len(record))
text = (record * (n - 1) + b'{"a":1' + b" " * pad + b"}\n" + before + b"\n null\n"
        + record * 3)
try:
    read_json_text(text)
except pa.ArrowInvalid:
    print("refused")
"""


@pytest.mark.parametrize("before", ["5", '"s"', "[1]", "true", "{}"])
def test_read_json_text_refuses_a_null_record_at_a_block_start(before):
    """pyarrow parses JSON lines in 1 MiB blocks, in parallel where its thread
    pool has more than one thread, and segfaults on a block whose first record
    is `null`. After a record that is not an object that `null` was not looked
    for: the process crashed instead of raising, so the caller's bad-record
    walk never named the line. (Ray workers run pyarrow with one thread, where
    the earlier block's error comes first; the driver and other callers do not.)"""
    r = subprocess.run([sys.executable, "-c", _NULL_AT_A_BLOCK_START, before],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "4"})
    assert (r.returncode, r.stdout.strip()) == (0, "refused"), (r.returncode, r.stderr[-500:])
