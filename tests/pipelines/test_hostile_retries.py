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
    "import sys; sys.path.insert(0, {here!r}); import _crash_transform; "
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
