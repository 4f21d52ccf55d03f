"""The `slicefeed` console script, run as a subprocess like a user would."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from slicefeed.connectors import is_committed
from tests._harness import run_slicefeed

HERE = os.path.dirname(os.path.abspath(__file__))


# Commands that need Ray join the session's cluster; the demo's first run starts
# its own, as on a fresh machine.
pytestmark = pytest.mark.usefixtures("ray_cluster")
slicefeed = run_slicefeed


@pytest.fixture
def spec_file(local_dir):
    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(50))
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_runs_twice_and_feeds_jax(tmp_path):
    out_dir = str(tmp_path / "demo dir")
    # One CPU device (the test session itself simulates 8).
    r = slicefeed("demo", "--dir", out_dir, "--rows", "2000", env={"XLA_FLAGS": ""}, own_ray=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "demo: wrote 2000 JSONL documents in 4 files" in r.stdout
    assert "text-lm: read 2000 rows, wrote" in r.stdout and "rows/s" in r.stdout
    assert "packing efficiency" in r.stdout
    # The trainer's path: the committed dataset through a JaxLoader on this machine's devices.
    assert "to a JaxLoader on 1 JAX device(s) (cpu), global_batch_size=16:" in r.stdout
    assert "  tokens: shape (16, 2048) int32, NamedSharding(mesh {'data': 1}" in r.stdout
    assert is_committed(os.path.join(out_dir, "out"))
    r = slicefeed("inspect", os.path.join(out_dir, "out"), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["kind"] == "committed slicefeed dataset" and info["num_rows"] > 0
    assert info["schema"] == {
        c: "fixed_shape_tensor<int32>[2048]" for c in ("tokens", "segment_ids", "positions")
    }
    # Twice: the regenerated corpus is the same, its dataset is reused, the loader runs again;
    # with 8 simulated devices the batch is sharded 8 ways. This and the next run join
    # the session's cluster (RAY_ADDRESS), as on a shared one.
    r = slicefeed("demo", "--dir", out_dir, "--rows", "2000",
                  env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already committed" in r.stdout, r.stdout
    assert "JaxLoader on 8 JAX device(s) (cpu)" in r.stdout
    assert "NamedSharding(mesh {'data': 8}, spec P('data',))" in r.stdout
    # Another corpus size: the demo replaces its own dataset rather than refusing.
    r = slicefeed("demo", "--dir", out_dir, "--rows", "1000", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "text-lm: read 1000 rows" in r.stdout and "demo: wrote" not in r.stdout


@pytest.mark.slow  # five CLI subprocesses, each starting Ray: 166 s measured under load
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


def test_validate_and_inspect_name_tensor_columns(local_dir):
    """The static output schema (what JaxLoader(pipeline) plans from) and inspect
    show fixed-shape columns as tensors with their shape and the bfloat16 convention."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slicefeed.pipelines.recipes import recipe_path

    raw = os.path.join(local_dir, "corpus")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.write(json.dumps({"text": "hello"}) + "\n")
    r = slicefeed("validate", recipe_path("text_lm"), "--set", f"source.uri={raw}",
                  "--set", f"sink.uri={local_dir}/out", "--set", "transforms.1.pack_sequences.seq_len=64")
    assert r.returncode == 0, r.stderr
    for c in ("tokens", "segment_ids", "positions"):
        assert f"  {c}: fixed_shape_tensor<int32>[64]\n" in r.stdout, r.stdout
    bits = pa.FixedSizeListArray.from_arrays(pa.array([0x3F80] * 24, pa.uint16()), 24)
    image = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.uint16(), (2, 4, 3)), bits)
    schema = pa.schema([pa.field("image", image.type, metadata={b"slicefeed.dtype": b"bfloat16"})])
    pq.write_table(pa.Table.from_arrays([image], schema=schema), os.path.join(raw, "img.parquet"))
    r = slicefeed("inspect", os.path.join(raw, "img.parquet"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == {"image": "fixed_shape_tensor<uint16 (bfloat16 bits)>[2,4,3]"}


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


def test_version():
    r = slicefeed("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("slicefeed ") and "ray " in r.stdout and "jax " in r.stdout


def _ray_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines()
            if "\tINFO " in ln or " INFO " in ln or "Token authentication" in ln]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_output_quiet_default_verbose_and_report(spec_file, local_dir):
    # Default: progress in rows named after the transforms, one line per update in a
    # log (stderr is a pipe here); none of Ray's own INFO lines or auth notice.
    r = slicefeed("run", spec_file, "--progress-interval", "0.5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not _ray_lines(r.stdout + r.stderr), _ray_lines(r.stdout + r.stderr)
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("cli-test: ")]
    assert progress and "\r" not in r.stderr, r.stderr[-2000:]
    assert progress[-1] == progress[-1].strip()
    assert "50 rows read | filter 50 -> 40 | cast 40 | written 40 |" in progress[-1], progress
    assert r.stdout.startswith("cli-test: read 50 rows, wrote 40 rows")
    assert "MB Parquet on disk" in r.stdout and "MB as Arrow in memory" in r.stdout
    # _report.json: per-transform rows in/out and time as fields.
    with open(os.path.join(local_dir, "out", "_report.json")) as f:
        report = json.load(f)
    got = [{k: t[k] for k in ("index", "name", "rows_in", "rows_out", "rows_bad")}
           for t in report["transforms"]]
    assert got == [{"index": 0, "name": "filter", "rows_in": 50, "rows_out": 40, "rows_bad": 0},
                   {"index": 1, "name": "cast", "rows_in": 40, "rows_out": 40, "rows_bad": 0}]
    assert all(isinstance(t["time_s"], float) and t["time_s"] >= 0 for t in report["transforms"])
    assert report["bytes_in_memory"] > 0 and report["bytes_written"] > 0
    # -q: only the final summary (and errors).
    r = slicefeed("-q", "run", spec_file, "--overwrite")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [r.stdout.strip()] and r.stdout.startswith("cli-test: read 50")
    assert r.stderr == "", r.stderr[-2000:]
    # -v (after the subcommand too): Ray's own lines are there.
    r = slicefeed("run", spec_file, "--overwrite", "-v")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _ray_lines(r.stdout + r.stderr), r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dated_sink(spec_file, local_dir):
    from slicefeed.connectors import is_committed, resolve_filesystem

    dated = os.path.join(local_dir, "nightly", "{date}")
    r = slicefeed("validate", spec_file, "--set", f"sink.uri={dated}", "--date", "2026-1-2")
    assert r.returncode == 2 and "expected YYYY-MM-DD" in r.stderr, r.stderr[-2000:]
    r = slicefeed("-q", "run", spec_file, "--set", f"sink.uri={dated}", "--date", "2026-01-02")
    assert r.returncode == 0, r.stderr[-3000:]
    out = os.path.join(local_dir, "nightly", "2026-01-02")
    assert out in r.stdout and is_committed(resolve_filesystem(out))


def _closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rerun_sees_input_changes_and_decides_before_ray(spec_file, local_dir):
    from slicefeed.pipelines import load_pipeline

    # The first run, through the API on the session's warm workers: the subject
    # is what the `slicefeed run`s after it decide.
    assert load_pipeline(spec_file).run().status == "committed"
    # Same spec, same input: nothing to do, decided without Ray (no cluster listens at that
    # address, so a run that started Ray would fail).
    no_ray = {"RAY_ADDRESS": _closed_port()}
    r = slicefeed("run", spec_file, env={**no_ray, "PYTHONPROFILEIMPORTTIME": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing to do" in r.stdout
    # Nor is Ray imported (seconds of start-up for a no-op, e.g. a nightly cron rerun).
    imported = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    assert "slicefeed.pipelines._pipeline" in imported and "ray" not in imported, sorted(imported)[:50]
    # Two files added, one changed: refused, saying so and how to proceed, still without Ray.
    raw = os.path.join(local_dir, "raw")
    for name in ("b.jsonl", "c.jsonl"):
        with open(os.path.join(raw, name), "w") as f:
            f.write(json.dumps({"id": 1, "text": "new"}) + "\n")
    with open(os.path.join(raw, "a.jsonl"), "a") as f:
        f.write(json.dumps({"id": 50, "text": "appended"}) + "\n")
    r = slicefeed("run", spec_file, env=no_ray)
    assert r.returncode == 2, (r.stdout, r.stderr[-3000:])
    assert "2 input files added, 1 changed since the committed run" in r.stderr, r.stderr
    assert "--overwrite" in r.stderr and "{date}" in r.stderr and "Traceback" not in r.stderr
    # Proceeding as told: --overwrite recomputes over the new input.
    r = slicefeed("-q", "run", spec_file, "--overwrite")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("cli-test: read 53 rows, wrote 42 rows"), r.stdout
    r = slicefeed("run", spec_file, env=no_ray)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stderr[-3000:]
