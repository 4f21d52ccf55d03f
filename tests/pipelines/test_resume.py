"""Crash and resume: a killed run never looks committed; a rerun finishes the job.

- ``slicefeed run`` (the real CLI, its own driver process on the session's
  Ray cluster, as on a KubeRay head) is SIGKILLed while shards are being written; no manifest is ever visible;
  the rerun commits a dataset whose manifest (row counts and checksums) is
  identical to an uninterrupted run's.
- Reruns are idempotent: same fingerprint -> exit 0 "already committed",
  nothing recomputed; a different fingerprint is refused (exit 2) unless
  ``--overwrite``.
- A Ray worker process SIGKILLed mid-job: Ray retries its task, the job
  completes with the right rows and counts that still add up.

A test-only transform (tests/pipelines/_stall_transform.py) stalls one batch
so the kill lands mid-job; it stalls once only (a marker file), so reruns and
retries run straight through with the same spec and fingerprint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from slicefeed.connectors import is_committed, read_manifest, resolve_filesystem

HERE = os.path.dirname(os.path.abspath(__file__))
N_FILES, ROWS = 20, 20
LEASE_TTL_S = 3  # the killed runs' writer lease

_CLI = (
    "import sys; sys.path.insert(0, {root!r}); import tests.pipelines._stall_transform; "
    "from slicefeed.pipelines._ops.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _corpus(raw: str, files: int = N_FILES) -> None:
    os.makedirs(raw, exist_ok=True)
    for f in range(files):
        with open(os.path.join(raw, f"f{f:02d}.jsonl"), "w") as fh:
            fh.writelines(json.dumps({"id": f * ROWS + i, "text": f"doc {f}-{i} " * 3}) + "\n" for i in range(ROWS))


def _spec(tmp_path, marker: str, match: str, seconds: float) -> str:
    raw = str(tmp_path / "raw data")
    _corpus(raw)
    spec = {
        "name": "resume",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [
            {"test_stall": {"marker": marker, "match": match, "seconds": seconds}},
            {"cast": {"columns": {"id": "int32"}}},
        ],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out set")},
    }
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _cli(args: list[str], **popen) -> subprocess.Popen:
    """``slicefeed ARGS`` as its own driver process on the session's Ray cluster."""
    import ray

    env = dict(os.environ)
    env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return subprocess.Popen(
        [sys.executable, "-c", _CLI.format(root=os.path.dirname(os.path.dirname(HERE))), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **popen,
    )


def _reference(spec: str, sink: str):
    """The same pipeline run uninterrupted into ``sink``, in this process through the
    public API (the session's warm Ray workers): the manifest a rerun must match."""
    import tests.pipelines._stall_transform  # noqa: F401 - registers test_stall / test_gate
    from slicefeed.pipelines import load_pipeline

    assert load_pipeline(spec, [f"sink.uri={sink}"]).run().status == "committed"
    return read_manifest(sink)


def _wait_lease_lapsed(killed_at: float) -> None:
    """Waits until a writer SIGKILLed at ``killed_at`` (monotonic) holds no lease
    (``SLICEFEED_LEASE_TTL_S=3`` after its last refresh, which was before the kill)."""
    time.sleep(max(0.0, killed_at + LEASE_TTL_S + 0.5 - time.monotonic()))


def _finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"slicefeed run did not finish in {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err


def _ids(sink: str) -> list[int]:
    """The ``id`` column of the committed dataset, read with pyarrow from its manifest."""
    import pyarrow.parquet as pq

    m = read_manifest(sink)
    return sorted(i for f in m.files for i in pq.read_table(os.path.join(sink, f.path))["id"].to_pylist())


def _files(m) -> list[tuple[int, str]]:
    return sorted((f.num_rows, f.sha256) for f in m.files)


def _shards(uri: str) -> list[str]:
    return sorted(n for n in os.listdir(uri) if n.startswith("part-")) if os.path.isdir(uri) else []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_mid_write_then_rerun_commits_identical_dataset(ray_cluster, tmp_path, monkeypatch):
    marker = str(tmp_path / "stalled")
    spec = _spec(tmp_path, marker, match="f15", seconds=300)
    sink = str(tmp_path / "out set")
    ref_sink = str(tmp_path / "reference")

    # The killed run's writer lease lapses 3 s after the kill; its shards are
    # then strays that the rerun's commit removes.
    monkeypatch.setenv("SLICEFEED_LEASE_TTL_S", str(LEASE_TTL_S))
    proc = _cli(["run", spec])
    monkeypatch.delenv("SLICEFEED_LEASE_TTL_S")
    try:
        deadline = time.monotonic() + 240
        while not (os.path.exists(marker) and _shards(sink)):
            assert proc.poll() is None, f"run ended before the kill: {proc.communicate()}"
            assert not is_committed(sink), "a manifest appeared while the job was running"
            assert time.monotonic() < deadline, "the run never reached the stall"
            time.sleep(0.2)
        for _ in range(10):  # other tasks keep writing shards meanwhile
            assert not is_committed(sink), "a manifest appeared while the job was running"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.communicate()
    assert _shards(sink), "the kill did not land mid-write"
    assert not is_committed(sink)

    # The reference: the same pipeline, uninterrupted (the stall is spent).
    reference = _reference(spec, ref_sink)
    assert reference.num_rows == N_FILES * ROWS

    # The rerun finishes the job: identical manifest, strays gone.
    _wait_lease_lapsed(killed_at)
    rc, _, err = _finish(_cli(["run", spec]))
    assert rc == 0, err
    m = read_manifest(sink)
    assert m.fingerprint == reference.fingerprint
    assert m.num_rows == reference.num_rows == N_FILES * ROWS
    assert _files(m) == _files(reference)
    assert _shards(sink) == sorted(f.path for f in m.files)
    assert _ids(sink) == list(range(N_FILES * ROWS))
    report = json.loads(Path(sink, "_report.json").read_text())
    assert report["rows_read"] == report["rows_written"] == N_FILES * ROWS
    # A third run of the same fingerprint (exit 0, "already committed"), and
    # another fingerprint refused unless --overwrite: test_cli.py's
    # test_run_validate_inspect runs that sequence.


def _descendant_of_us(pid: int) -> bool:
    me = os.getpid()
    for _ in range(20):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if ppid == me:
            return True
        if ppid <= 1:
            return False
        pid = ppid
    return False


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_worker_killed_mid_job_still_completes(ray_cluster, tmp_path):
    import tests.pipelines._stall_transform  # noqa: F401 - registers test_stall
    from slicefeed.pipelines import Pipeline

    marker = str(tmp_path / "stalled")
    with open(_spec(tmp_path, marker, match="f07", seconds=120)) as f:
        spec = yaml.safe_load(f)
    result: dict = {}

    def run():
        try:
            result["report"] = Pipeline(spec).run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while not os.path.exists(marker):
        assert t.is_alive(), f"run ended before the kill: {result}"
        assert time.monotonic() < deadline, "the run never reached the stall"
        time.sleep(0.2)
    pid = int(Path(marker).read_text())
    # Only ever kill a worker of this test session's own Ray cluster.
    assert pid != os.getpid() and _descendant_of_us(pid), f"pid {pid} is not our Ray worker"
    os.kill(pid, signal.SIGKILL)
    t.join(timeout=240)
    assert not t.is_alive(), "the run did not finish after the worker was killed"
    assert "error" not in result, result.get("error")
    report = result["report"]
    sink = spec["sink"]["uri"]
    assert report.status == "committed"
    # Every row exactly once, and no double counting of the retried task.
    assert _ids(sink) == list(range(N_FILES * ROWS))
    assert report.rows_read == report.rows_written == N_FILES * ROWS
    assert report.rows_filtered == report.rows_skipped == report.rows_quarantined == 0
    assert read_manifest(sink).num_rows == N_FILES * ROWS
    assert not os.path.exists(resolve_filesystem(sink).join("_quarantine").path)


def _records(sink: str) -> list[str]:
    """The side records of finished units. A record being written is a hidden
    temporary file until it is linked to its name: not a finished unit yet."""
    d = os.path.join(sink, "_units")
    return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_after_half_the_shards_rerun_reuses_them(ray_cluster, tmp_path, monkeypatch):
    """A crash rerun verifies and reuses the shards the killed run finished,
    reads only the other input files, and commits the rows of a clean run."""
    import pyarrow.parquet as pq

    raw = str(tmp_path / "raw data")
    _corpus(raw)
    gate = tmp_path / "gate"
    gate.mkdir()
    marker, release = str(gate / "held"), str(gate / "released")
    second_half = [f"f{f:02d}" for f in range(N_FILES // 2, N_FILES)]
    sink, ref_sink = str(tmp_path / "out set"), str(tmp_path / "reference")
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({
        "name": "gate",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [
            {"test_gate": {"folder": str(gate), "match": second_half, "seconds": 300}},
            {"cast": {"columns": {"id": "int32"}}},
        ],
        "sink": {"format": "parquet", "uri": sink},
    }))
    spec = str(path)

    monkeypatch.setenv("SLICEFEED_LEASE_TTL_S", str(LEASE_TTL_S))
    proc = _cli(["run", spec])
    monkeypatch.delenv("SLICEFEED_LEASE_TTL_S")
    try:
        deadline = time.monotonic() + 240
        # The first half of the files is finished (shard + side record); the
        # second half is held back.
        while not (os.path.exists(marker) and len(_records(sink)) >= N_FILES // 2):
            assert proc.poll() is None, f"run ended before the kill: {proc.communicate()}"
            assert time.monotonic() < deadline, f"the run never got half way: {_records(sink)}"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.communicate()
    assert not is_committed(sink)
    finished = len(_records(sink))
    assert finished == N_FILES // 2, _records(sink)
    crashed_shards = set(_shards(sink))
    assert len(crashed_shards) == finished
    # Released only once the killed writer's lease has lapsed (by then Ray has also
    # ended the killed job's held tasks, so none of them writes another shard).
    _wait_lease_lapsed(killed_at)
    open(release, "w").close()

    reference = _reference(spec, ref_sink)

    rc, out, err = _finish(_cli(["run", spec]))
    assert rc == 0, err
    m = read_manifest(sink)
    assert m.fingerprint == reference.fingerprint
    with open(os.path.join(sink, "_report.json")) as fh:
        report = json.load(fh)
    total = sum(os.path.getsize(os.path.join(raw, n)) for n in os.listdir(raw))
    assert report["shards_reused"] == finished, report
    assert report["units"] == N_FILES
    assert report["bytes_read"] <= 0.6 * total, (report["bytes_read"], total)
    assert "reused the verified shards of 10 of 20 input files" in out
    # The crashed run's shards are committed as they were; the rest are new.
    assert crashed_shards <= {f.path for f in m.files}
    assert _files(m) == _files(reference)
    assert _ids(sink) == list(range(N_FILES * ROWS))
    rows = sorted(tuple(r.values()) for f in m.files
                  for r in pq.read_table(os.path.join(sink, f.path)).to_pylist())
    ref_rows = sorted(tuple(r.values()) for f in reference.files
                      for r in pq.read_table(os.path.join(ref_sink, f.path)).to_pylist())
    assert rows == ref_rows
    # Counts cover every unit, reused or not, as in the clean run.
    assert report["rows_read"] == report["rows_written"] == N_FILES * ROWS
    assert _shards(sink) == sorted(f.path for f in m.files)
    print(f"rerun read {report['bytes_read']} of {total} input bytes "
          f"({report['bytes_read'] / total:.0%}); reused {report['shards_reused']} shards")


def _gated_spec(tmp_path) -> tuple[str, str, str, str]:
    """A spec whose second half of input files waits for ``<gate>/released``:
    (spec, sink, the marker written once a file is held, the release file)."""
    raw = str(tmp_path / "raw data")
    _corpus(raw)
    gate = tmp_path / "gate"
    gate.mkdir()
    sink = str(tmp_path / "out set")
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({
        "name": "gate",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [
            {"test_gate": {"folder": str(gate),
                           "match": [f"f{f:02d}" for f in range(N_FILES // 2, N_FILES)],
                           "seconds": 300}},
            {"cast": {"columns": {"id": "int32"}}},
        ],
        "sink": {"format": "parquet", "uri": sink},
    }))
    return str(path), sink, str(gate / "held"), str(gate / "released")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_writer_paused_past_its_lease_never_commits_removed_shards(ray_cluster, tmp_path,
                                                                   monkeypatch):
    """A writer paused past its lease's lifetime (SIGSTOP here; a paused VM or
    a stalled host do the same) is judged dead by a vacuum, which removes its
    shards and its lease. Resumed, its lease thread wrote the lease again, and
    it committed a version listing the removed shards (exit 0; every rerun then
    said there was nothing to do). It must fail, and the version it meant to
    replace stay current and whole."""
    import tests.pipelines._stall_transform  # noqa: F401 - registers test_gate
    from slicefeed.pipelines import load_pipeline

    spec, sink, held, release = _gated_spec(tmp_path)
    open(release, "w").close()
    # Version 1 in this process (the session's warm Ray workers); the subject is the run after.
    assert load_pipeline(spec).run().status == "committed"
    os.remove(release)
    v1 = read_manifest(sink)

    monkeypatch.setenv("SLICEFEED_LEASE_TTL_S", str(LEASE_TTL_S))
    proc = _cli(["run", spec, "--set", "seed=7", "--overwrite"])
    monkeypatch.delenv("SLICEFEED_LEASE_TTL_S")
    try:
        deadline = time.monotonic() + 240
        while not (os.path.exists(held) and len(_shards(sink)) >= len(v1.files) + N_FILES // 2):
            assert proc.poll() is None, f"run ended before the pause: {proc.communicate()}"
            assert time.monotonic() < deadline, f"the run never got half way: {_shards(sink)}"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(LEASE_TTL_S + 1.5)
        rc, out, err = _finish(_cli(["vacuum", sink, "--retain-hours", "10000"]))
        assert rc == 0, err
        assert len(_shards(sink)) == len(v1.files), "the vacuum left the paused writer's shards"
        open(release, "w").close()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    rc, out, err = _finish(proc)
    assert rc == 1 and "nothing was committed" in err, (rc, out, err)
    m = read_manifest(sink)
    assert m.version == 1 and m.fingerprint == v1.fingerprint
    assert _shards(sink) == sorted(f.path for f in m.files)
    assert _ids(sink) == list(range(N_FILES * ROWS))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_dataset_level_op_reports_that_a_rerun_recomputes_everything(ray_cluster, tmp_path):
    """A pipeline whose rows depend on other input files runs without units,
    and its report says why a rerun would recompute everything."""
    from slicefeed.pipelines import Pipeline

    raw = str(tmp_path / "raw data")
    _corpus(raw, files=3)  # several input files; a whole-dataset op over 20 is only slower
    spec = {
        "name": "dedup",
        "source": {"format": "jsonl", "uri": raw},
        "transforms": [{"deduplicate": {"columns": ["text"], "partitions": 4}}],
        "sink": {"format": "parquet", "uri": str(tmp_path / "out")},
    }
    report = Pipeline(spec).run()
    assert report.units == 0 and report.shards_reused == 0
    assert "`deduplicate` works on the whole dataset" in report.reuse
    assert "recomputes everything" in report.reuse
    assert report.rows_written == 3 * ROWS
    assert not os.path.exists(os.path.join(str(tmp_path / "out"), "_units"))
