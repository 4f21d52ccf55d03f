"""The commit protocol as `slicefeed` users meet it: concurrent runs, overwrite,
vacuum, sinks overlapping sources, corrupt manifests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slicefeed.connectors import (
    current_version,
    list_versions,
    read_dataset,
    read_manifest,
    resolve_filesystem,
)
from tests._harness import put_bytes

HERE = os.path.dirname(os.path.abspath(__file__))

_CLI = (
    "import sys; sys.path.insert(0, {root!r}); import tests.pipelines._barrier_transform; "
    "from slicefeed.pipelines._ops.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _cli(*args: str, cluster: bool = True) -> subprocess.Popen:
    """``slicefeed ARGS`` as its own driver process (on the session's Ray cluster)."""
    env = dict(os.environ)
    if cluster:
        import ray

        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return subprocess.Popen(
        [sys.executable, "-c", _CLI.format(root=os.path.dirname(os.path.dirname(HERE))), *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def _run(*args: str, cluster: bool = True, timeout: float = 300) -> tuple[int, str, str]:
    p = _cli(*args, cluster=cluster)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def _corpus(raw: str, files: int = 3, rows: int = 10) -> None:
    for f in range(files):
        put_bytes(f"{raw}/f{f}.jsonl", "".join(
            json.dumps({"id": f * rows + i, "text": f"doc {f}-{i}"}) + "\n" for i in range(rows)))


def _commit_v1(spec: str) -> None:
    """Commits version 1 in this process through the public API (the session's warm
    Ray workers), for tests whose subject is a later `slicefeed` run."""
    from slicefeed.pipelines import load_pipeline

    assert load_pipeline(spec).run().status == "committed"


def _spec_file(tmp_path, raw: str, sink: str, *, barrier: str = "", name: str = "spec.yaml",
               source_uri: str | None = None) -> str:
    transforms = [{"cast": {"columns": {"id": "int32"}}}]
    if barrier:
        transforms.insert(0, {"test_barrier": {"dir": barrier}})
    spec = {"name": "commit", "source": {"format": "jsonl", "uri": source_uri or raw},
            "transforms": transforms, "sink": {"format": "parquet", "uri": sink}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _data_shards(sink: str) -> set[str]:
    t = resolve_filesystem(sink)
    return {p.rsplit("/", 1)[-1] for p in t.fs.find(t.path) if p.endswith(".parquet")
            and "/_" not in p[len(t.path):]}


# Each race runs on one storage (four Ray drivers per backend took 25 s); the
# protocol under both races is tested on both storages in test_commit_protocol.
@pytest.mark.parametrize("base_uri", ["local"], indirect=True)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_concurrent_runs_of_one_spec_commit_once(ray_cluster, base_uri, tmp_path):
    """Two `slicefeed run` processes of one spec and inputs race for one sink:
    both exit 0, one reports "already committed", and the sink holds exactly the
    listed shards."""
    raw, sink = f"{base_uri}/raw", f"{base_uri}/out"
    _corpus(raw)
    b1 = tmp_path / "b1"
    b1.mkdir()
    spec = _spec_file(tmp_path, raw, sink, barrier=str(b1))
    procs = [_cli("run", spec), _cli("run", spec)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert [r[0] for r in results] == [0, 0], [r[2][-2000:] for r in results]
    outs = sorted(r[1] for r in results)
    assert sum("already committed" in o for o in outs) == 1, outs
    assert list(list_versions(sink)) == [1]
    assert sorted(r["id"] for r in read_dataset(sink).take_all()) == list(range(30))
    assert _data_shards(sink) == {f.path for f in read_manifest(sink).files}


@pytest.mark.parametrize("base_uri", ["gcs"], indirect=True)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_concurrent_overwrites_one_commits_the_other_conflicts(ray_cluster, base_uri, tmp_path):
    """Two `slicefeed run --overwrite` processes of different specs race over a
    committed sink: one commits version 2, the other fails with
    CommitConflictError (exit 1); both versions' shards, and only those, remain."""
    raw, sink = f"{base_uri}/raw", f"{base_uri}/out"
    _corpus(raw)
    _commit_v1(_spec_file(tmp_path, raw, sink, name="spec1.yaml"))
    b2 = tmp_path / "b2"
    b2.mkdir()
    spec2 = _spec_file(tmp_path, raw, sink, barrier=str(b2), name="spec2.yaml")
    procs = [_cli("run", spec2, "--overwrite"),
             _cli("run", spec2, "--overwrite", "--set", "seed=3")]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 1], [r[2][-2000:] for r in results]
    loser = next(r for r in results if r[0] == 1)
    assert "CommitConflictError" in loser[2] and "committed version 2" in loser[2], loser[2][-2000:]
    assert current_version(sink) == 2 and list(list_versions(sink)) == [1, 2]
    assert _data_shards(sink) == {f.path for v in (1, 2) for f in read_manifest(sink, version=v).files}


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_overwrite_recomputes_an_input_edited_in_place(ray_cluster, local_dir, tmp_path):
    """An input edited in place with its size and mtime kept looks unchanged to
    a rerun ("nothing to do", as documented); --overwrite, the documented way to
    recompute, commits the new rows instead of the committed shards again."""
    raw, sink = f"{local_dir}/raw-edited", f"{local_dir}/out-edited"
    _corpus(raw)
    spec = _spec_file(tmp_path, raw, sink)
    _commit_v1(spec)
    path = f"{raw}/f1.jsonl"
    st = os.stat(path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data.replace(b"doc 1-0", b"NEW 1-0"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out, err = _run("run", spec, "--overwrite")
    assert code == 0, err[-2000:]
    assert "reused" not in out + err
    texts = sorted(r["text"] for r in read_dataset(sink).take_all())
    assert "NEW 1-0" in texts and "doc 1-0" not in texts and len(texts) == 30


@pytest.mark.slow
def test_failed_overwrite_keeps_previous_version_then_vacuum(ray_cluster, local_dir, tmp_path):
    raw, sink = f"{local_dir}/raw", f"{local_dir}/out"
    _corpus(raw)
    spec = _spec_file(tmp_path, raw, sink)
    _commit_v1(spec)
    v1 = read_manifest(sink)
    # A bad record under on_error: fail makes the overwrite fail after writing shards.
    put_bytes(f"{raw}/f9.jsonl", '{"id": "not a number", "text": "x"}\n')
    code, _, err = _run("run", spec, "--overwrite", "--set", "seed=5")
    assert code == 1, err[-2000:]
    assert read_manifest(sink) == v1 and current_version(sink) == 1
    assert sorted(r["id"] for r in read_dataset(sink).take_all()) == list(range(30))
    report = json.loads(Path(sink, "_report.json").read_text())
    assert report["rows_written"] == 30  # the committed run's report is still there
    os.remove(f"{raw}/f9.jsonl")
    from slicefeed.pipelines import load_pipeline

    assert load_pipeline(spec, ["seed=5"]).run(overwrite=True).status == "committed"
    v2 = read_manifest(sink)
    assert v2.version == 2 and v2.report and os.path.exists(os.path.join(sink, v2.report))
    assert read_dataset(sink, version=1).count() == 30
    code, out, err = _run("vacuum", sink, cluster=False)
    assert code == 0 and "removed versions: none" in out, err
    code, out, err = _run("vacuum", sink, "--retain-hours", "0", "--json", cluster=False)
    assert code == 0, err
    assert json.loads(out)["versions_removed"] == [1]
    assert not any(os.path.exists(os.path.join(sink, f.path)) for f in v1.files)
    assert all(os.path.exists(os.path.join(sink, f.path)) for f in v2.files)
    code, _, err = _run("vacuum", sink, "--retain-hours", "-1", cluster=False)
    assert code == 2 and "--retain-hours: must be a number of hours >= 0" in err


# `run` and `validate` refuse through the same check; `run` is also tried where
# the sink is the source itself and where a template expands to it.
@pytest.mark.parametrize("sink_of, also_run", [
    (lambda raw: raw, True),                           # the source folder itself
    (lambda raw: raw + "/", False),                    # trailing slash
    (lambda raw: "file://" + raw, False),              # file:// URI
    (lambda raw: raw + "/sub/..", False),              # '..'
    (lambda raw: os.path.dirname(raw), False),         # contains the source
    (lambda raw: raw + "/out", False),                 # inside the source
    (lambda raw: raw + "/{date}/..", True),            # a template that expands to it
])
@pytest.mark.slow
def test_sink_overlapping_source_is_refused(local_dir, tmp_path, sink_of, also_run):
    raw = os.path.join(local_dir, "raw")
    _corpus(raw)
    spec = _spec_file(tmp_path, raw, sink_of(raw))
    before = sorted(os.listdir(raw))
    code, _, err = _run("validate", spec, cluster=False, timeout=120)
    assert code == 2 and "overlaps source" in err and "write to a separate prefix" in err, err
    if also_run:
        code, _, err = _run("run", spec, cluster=False, timeout=120)
        assert code == 2 and "overlaps source" in err, err
    assert sorted(os.listdir(raw)) == before


def test_sink_in_spark_style_input_folder_is_refused(local_dir, tmp_path):
    """Spark-style part-*.parquet inputs read by glob; the sink is their folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = os.path.join(local_dir, "spark")
    os.makedirs(raw)
    for k in range(2):
        pq.write_table(pa.table({"id": [k], "text": ["x"]}), f"{raw}/part-0000{k}-abc.snappy.parquet")
    spec = {"name": "s", "source": {"format": "parquet", "uri": f"{raw}/part-*.parquet"},
            "sink": {"format": "parquet", "uri": raw}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = _run("run", str(path), cluster=False, timeout=120)
    assert code == 2 and "overlaps source" in err, err
    assert len(os.listdir(raw)) == 2
    # A sink beside the glob's files, which the pattern cannot match, is fine.
    from slicefeed.pipelines import Pipeline

    spec["sink"]["uri"] = f"{raw}/out"
    Pipeline(spec).check_sink()


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_corrupt_manifest_does_not_block_overwrite(ray_cluster, local_dir, tmp_path):
    raw, sink = f"{local_dir}/raw", f"{local_dir}/out"
    _corpus(raw)
    spec = _spec_file(tmp_path, raw, sink)
    _commit_v1(spec)
    (vfile,) = [loc.path for loc in list_versions(sink).values()]
    with open(vfile, "w") as f:
        f.write('{"format": "slicefeed.dataset/v2", "files": [tr')
    code, _, err = _run("run", spec)
    assert code == 1 and "is not a valid slicefeed manifest: not JSON" in err, err
    code, _, err = _run("run", spec, "--overwrite")
    assert code == 0, err[-2000:]
    assert current_version(sink) == 2
    assert sorted(r["id"] for r in read_dataset(sink).take_all()) == list(range(30))
    aside = os.listdir(os.path.join(sink, "_corrupt"))
    assert len(aside) == 1 and aside[0].startswith(os.path.basename(vfile))
    assert not os.path.exists(vfile)
