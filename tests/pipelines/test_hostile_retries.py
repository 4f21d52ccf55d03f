"""A transform that kills its worker deterministically ends the run, bounded.

Ray Data retries tasks whose worker died without limit by default; slicefeed
bounds the retries (``task_retries``, default 2) and names the input file and
the transform that kept dying.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from slicefeed.connectors import is_committed

HERE = os.path.dirname(os.path.abspath(__file__))

_CLI = (
    "import sys; sys.path.insert(0, {here!r}); import _crash_transform, _crashfs; "
    "from slicefeed.pipelines._ops.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("retries", [None, 0])
def test_worker_killed_on_one_file_fails_the_run_naming_it(ray_cluster, tmp_path, retries):
    import ray

    raw = tmp_path / "raw data"
    raw.mkdir()
    for f in range(4):
        with open(raw / f"f{f}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"id": f * 10 + i}) + "\n" for i in range(10))
    log = tmp_path / "attempts.log"
    spec = {
        "name": "crashy",
        "source": {"format": "jsonl", "uri": str(raw)},
        "transforms": [{"test_crash": {"log": str(log), "match": "f2.jsonl"}}],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
    }
    if retries is not None:
        spec["task_retries"] = retries
    path = tmp_path / "crashy.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address,
               RAY_DATA_DISABLE_PROGRESS_BARS="1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _CLI.format(here=HERE), "run", str(path)],
                       capture_output=True, text=True, timeout=300, env=env)
    wall = time.monotonic() - t0
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    expected = 3 if retries is None else retries + 1
    attempts = log.read_text().split()
    assert len(attempts) == expected, attempts
    assert "f2.jsonl" in r.stderr and "test_crash" in r.stderr, r.stderr[-3000:]
    assert f"{expected} times" in r.stderr and "task_retries" in r.stderr, r.stderr[-3000:]
    assert not is_committed(str(tmp_path / "out"))
    assert wall < 240


# Where the worker dies: (transforms, source options, what runs on the
# crashing filesystem, what the error must name). ``shuffle_seed`` and
# ``deduplicate`` run the job through Ray Data (read tasks, map tasks, a
# shuffle, write tasks); otherwise it runs one task per input file.
_WHERE = {
    "read-per-file": ([], {}, "source", ["f2-CRASH.jsonl", "reading"]),
    "read-dataset": ([], {"shuffle_seed": 1}, "source", ["f2-CRASH.jsonl", "reading"]),
    "deduplicate": ([{"test_crash_dedup": {"match": "f2-CRASH", "partitions": 4}}], {}, None,
                    ["f2-CRASH.jsonl", "test_crash_dedup"]),
    "write": ([], {"shuffle_seed": 1}, "sink", ["out-CRASH", "writing"]),
}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("where", list(_WHERE))
def test_worker_killed_reading_deduplicating_or_writing_fails_bounded(ray_cluster, tmp_path, where):
    """A worker that dies every time it reads one input file, deduplicates its
    rows or writes the sink ends the run after ``task_retries`` reruns, with an
    error naming the file (or the sink) and the stage; Ray's default would
    rerun it forever."""
    import ray

    transforms, options, crash_on, names = _WHERE[where]
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in range(4):
        name = "f2-CRASH.jsonl" if f == 2 else f"f{f}.jsonl"
        with open(raw / name, "w") as fh:
            fh.writelines(json.dumps({"id": f * 10 + i}) + "\n" for i in range(10))
    log = tmp_path / "attempts.log"  # _crashfs and test_crash_dedup log here
    for t in transforms:
        if "test_crash_dedup" in t:
            t["test_crash_dedup"]["log"] = str(log)
    out = tmp_path / ("out-CRASH" if crash_on == "sink" else "out")
    spec = {
        "name": "crashy",
        "source": {"format": "jsonl", "options": options,
                   "uri": f"crashfs://{raw}" if crash_on == "source" else str(raw)},
        "transforms": transforms,
        "sink": {"format": "parquet", "uri": f"crashfs://{out}" if crash_on == "sink" else str(out),
                 # One write task, so one task's attempts are counted.
                 "options": {"min_rows_per_file": 1000} if crash_on == "sink" else {}},
        "task_retries": 1,
    }
    path = tmp_path / "crashy.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address,
               RAY_DATA_DISABLE_PROGRESS_BARS="1")
    # Unbounded retries would loop until this timeout.
    r = subprocess.run([sys.executable, "-c", _CLI.format(here=HERE), "run", str(path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    attempts = log.read_text().splitlines()
    assert len(attempts) == 2, attempts  # the first run and one rerun
    err = r.stderr[-3000:]
    for n in names + ["2 times", "task_retries=1"]:
        assert n in err, (n, err)
    assert not is_committed(str(out))
