"""The `slicefeed` console script, run as a subprocess like a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from slicefeed.connectors import is_committed

HERE = os.path.dirname(os.path.abspath(__file__))


def _env() -> dict:
    env = dict(os.environ)
    # A fresh CLI process starts its own local Ray; keep it small.
    env.pop("RAY_ADDRESS", None)
    env["RAY_DATA_DISABLE_PROGRESS_BARS"] = "1"
    return env


def slicefeed(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "slicefeed")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


@pytest.fixture
def spec_file(local_dir):
    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        for i in range(50):
            f.write(json.dumps({"id": i, "text": f"row {i}"}) + "\n")
    spec = {
        "name": "cli-test",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [{"filter": {"expr": "id < 40"}}, {"cast": {"columns": {"id": "int32"}}}],
        "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")},
    }
    path = os.path.join(local_dir, "pipe line.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return path


@pytest.mark.timeout(600)
def test_demo_runs_and_is_idempotent(tmp_path):
    out_dir = str(tmp_path / "demo dir")
    r = slicefeed("demo", "--dir", out_dir, "--rows", "2000")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "demo: wrote 2000 JSONL documents in 4 files" in r.stdout
    assert "text-lm: read 2000 rows, wrote" in r.stdout and "rows/s" in r.stdout
    assert is_committed(os.path.join(out_dir, "out"))
    r = slicefeed("inspect", os.path.join(out_dir, "out"), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["kind"] == "committed slicefeed dataset" and info["num_rows"] > 0
    assert info["schema"] == {
        c: "fixed_size_list<item: int32>[2048]" for c in ("tokens", "segment_ids", "positions")
    }


@pytest.mark.timeout(600)
def test_run_validate_inspect(spec_file, local_dir):
    r = slicefeed("validate", spec_file)
    assert r.returncode == 0, r.stderr
    assert "valid pipeline 'cli-test' (2 transforms" in r.stdout and "id: int32" in r.stdout
    r = slicefeed("run", spec_file, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["rows_read"] == 50 and report["rows_written"] == 40 and report["rows_filtered"] == 10
    r = slicefeed("run", spec_file)
    assert r.returncode == 0 and "already committed with this pipeline's fingerprint (40 rows)" in r.stdout
    # A different pipeline onto the same sink: refused (usage), then allowed with --overwrite.
    r = slicefeed("run", spec_file, "--set", "transforms.0.filter.expr=id < 10")
    assert r.returncode == 2, r.stderr
    assert "already holds a committed dataset written by another pipeline" in r.stderr
    assert "Traceback" not in r.stderr
    r = slicefeed("run", spec_file, "--set", "transforms.0.filter.expr=id < 10", "--overwrite")
    assert r.returncode == 0 and "wrote 10 rows" in r.stdout, r.stderr[-2000:]
    r = slicefeed("inspect", os.path.join(local_dir, "raw"))
    assert r.returncode == 0 and "raw jsonl files" in r.stdout and "rows: 50" in r.stdout


def test_usage_and_spec_errors_exit_2_without_traceback(spec_file, tmp_path):
    r = slicefeed("run", spec_file, "--set", "sourc.uri=x")
    assert r.returncode == 2
    assert "unknown key 'sourc' in (top level); allowed keys:" in r.stderr
    assert "Traceback" not in r.stderr
    r = slicefeed("frobnicate")
    assert r.returncode == 2 and "invalid choice: 'frobnicate'" in r.stderr
    r = slicefeed("validate", spec_file, "--set", "transforms.0={select: {columns: [nope]}}")
    assert r.returncode == 2 and "Select: column 'nope' not found; available: id, text" in r.stderr


def test_runtime_failure_exits_1(tmp_path):
    r = slicefeed("inspect", str(tmp_path / "not-there"))
    assert r.returncode == 1
    assert "FileNotFoundError: No file exists at" in r.stderr and "not-there" in r.stderr
    assert "Traceback" not in r.stderr
    r = slicefeed("--debug", "inspect", str(tmp_path / "not-there"))
    assert r.returncode == 1 and "Traceback" in r.stderr
