"""Pipeline.dataset() / run() on local disk and the GCS emulator."""

from __future__ import annotations

import json

import pytest

from slicefeed.connectors import (
    AlreadyCommittedError,
    BadRecordError,
    SpecError,
    is_committed,
    read_dataset,
    read_manifest,
    resolve_filesystem,
)
from slicefeed.pipelines import Pipeline
from tests._harness import put_bytes


def _corpus(base: str, files: int = 3, rows: int = 10) -> str:
    for f in range(files):
        lines = [json.dumps({"id": f * rows + i, "score": str(i), "text": f"t{i}"}) for i in range(rows)]
        put_bytes(f"{base}/raw/f{f}.jsonl", "\n".join(lines) + "\n")
    return f"{base}/raw"


def _spec(base: str, **kw):
    spec = {
        "name": "test",
        "source": {"format": "jsonl", "uri": f"{base}/raw"},
        "transforms": [
            {"filter": {"expr": "id >= 5"}},
            {"cast": {"columns": {"id": "int32", "score": "int32"}}},
            {"select": {"columns": ["id", "score"]}},
        ],
        "sink": {"format": "parquet", "uri": f"{base}/out"},
    }
    spec.update(kw)
    return spec


def test_dataset_is_lazy_and_transformed(ray_cluster, base_uri):
    _corpus(base_uri)
    p = Pipeline(_spec(base_uri))
    ds = p.dataset()
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(5, 30))
    assert set(rows[0]) == {"id", "score"}
    assert str(ds.schema().types[0]) == "int32"


@pytest.mark.slow
def test_run_commits_and_reports(ray_cluster, base_uri):
    _corpus(base_uri)
    report = Pipeline(_spec(base_uri)).run()
    assert report.status == "committed"
    assert (report.rows_read, report.rows_written, report.rows_filtered) == (30, 25, 5)
    assert report.filtered_by == {"filter": 5}
    m = read_manifest(f"{base_uri}/out")
    assert m.num_rows == 25 and m.fingerprint == report.fingerprint
    target = resolve_filesystem(f"{base_uri}/out")
    on_disk = json.loads(target.fs.cat_file(target.join("_report.json").path))
    assert on_disk["rows_written"] == 25 and on_disk["versions"]["ray"]
    # Same pipeline again: nothing recomputed.
    again = Pipeline(_spec(base_uri)).run()
    assert again.status == "already_committed" and again.rows_written == 25
    assert read_manifest(f"{base_uri}/out").files == m.files
    # Another pipeline onto the same sink is refused unless overwrite.
    other = _spec(base_uri, seed=3)
    with pytest.raises(AlreadyCommittedError, match="written by another pipeline .fingerprint"):
        Pipeline(other).run()
    assert Pipeline(other).run(overwrite=True).status == "committed"


@pytest.mark.slow
def test_run_is_deterministic(ray_cluster, base_uri):
    _corpus(base_uri)
    a = Pipeline(_spec(base_uri)).run()
    b = Pipeline(_spec(base_uri, sink={"format": "parquet", "uri": f"{base_uri}/out2"})).run()
    ma, mb = read_manifest(f"{base_uri}/out"), read_manifest(f"{base_uri}/out2")
    assert [f.sha256 for f in ma.files] == [f.sha256 for f in mb.files]
    assert a.fingerprint == b.fingerprint


def test_runs_in_one_driver_count_only_their_own_rows(ray_cluster, local_dir):
    """Runs of one driver share a counters actor one after another (it is reset
    between them): each report counts its own run's rows, after a committed run
    with the same batches and after a failed one."""
    _corpus(local_dir)

    def run(sink: str, **kw):
        return Pipeline(_spec(local_dir, sink={"format": "parquet", "uri": f"{local_dir}/{sink}"},
                              **kw)).run()

    # The same input files, so the same batches; another filter the second time.
    for sink, least in (("a", 5), ("b", 10)):
        transforms = [{"filter": {"expr": f"id >= {least}"}}, *_spec(local_dir)["transforms"][1:]]
        r = run(sink, transforms=transforms)
        assert (r.rows_read, r.rows_written, r.rows_filtered) == (30, 30 - least, least), sink
        assert r.filtered_by == {"filter": least}, sink
    put_bytes(f"{local_dir}/raw/f9.jsonl", '{"id": 101, "score": "seven", "text": "b"}\n')
    with pytest.raises(BadRecordError):
        run("c")
    r = run("d", on_error="skip", max_error_fraction=0.5)
    assert (r.rows_read, r.rows_written, r.rows_skipped, r.rows_filtered) == (31, 25, 1, 5)


def test_transform_checked_against_source_schema_before_ray(base_uri):
    _corpus(base_uri)
    spec = _spec(base_uri, transforms=[{"select": {"columns": ["txt"]}}])
    with pytest.raises(SpecError, match=r"Select: column 'txt' not found; available: id, score, text"):
        Pipeline(spec).check()


@pytest.mark.slow
def test_bad_record_fail_names_file_and_row(ray_cluster, base_uri):
    _corpus(base_uri)
    put_bytes(f"{base_uri}/raw/f1.jsonl", '{"id": 100, "score": "7", "text": "a"}\n{"id": 101, "score": "seven", "text": "b"}\n')
    with pytest.raises(Exception) as e:
        Pipeline(_spec(base_uri)).run()
    assert e.errisinstance(BadRecordError) or "BadRecordError" in str(e.value)
    assert "file 'f1.jsonl' row 1: Cast: value in column 'score' cannot be cast to int32" in str(e.value)
    assert not is_committed(f"{base_uri}/out")


@pytest.mark.slow
def test_bad_records_skip_counts_and_quarantine_writes(ray_cluster, base_uri):
    _corpus(base_uri)
    put_bytes(f"{base_uri}/raw/f1.jsonl", '{"id": 100, "score": "7", "text": "a"}\n{"id": 101, "score": "seven", "text": "b"}\n')
    r = Pipeline(_spec(base_uri, on_error="skip", max_error_fraction=0.5)).run()
    assert (r.rows_read, r.rows_written, r.rows_skipped, r.rows_filtered) == (22, 16, 1, 5)
    q = Pipeline(_spec(base_uri, on_error="quarantine", max_error_fraction=0.5,
                       sink={"format": "parquet", "uri": f"{base_uri}/q"})).run()
    assert q.rows_quarantined == 1
    assert q.rows_read == q.rows_written + q.rows_filtered + q.rows_quarantined
    # The quarantine is plain Parquet beside the dataset, not part of it.
    target = resolve_filesystem(f"{base_uri}/q/_quarantine")
    files = target.fs.find(target.path)
    assert len(files) == 1
    import pyarrow.parquet as pq

    with target.fs.open(files[0], "rb") as f:
        rec = pq.read_table(f).to_pylist()
    assert rec == [{"_sf_file": "f1.jsonl", "_sf_row": 1,
                    "_sf_error": "Cast: value in column 'score' cannot be cast to int32",
                    "transform": "cast"}]
    assert read_dataset(f"{base_uri}/q").count() == q.rows_written


def test_max_error_fraction_refuses_commit(ray_cluster, base_uri):
    _corpus(base_uri, files=1, rows=4)
    put_bytes(f"{base_uri}/raw/f1.jsonl", '{"id": 101, "score": "seven", "text": "b"}\n')
    with pytest.raises(Exception, match=r"1 of 5 rows were bad \(20.00%\), more than max_error_fraction=0.1"):
        Pipeline(_spec(base_uri, on_error="skip", max_error_fraction=0.1)).run()
    assert not is_committed(f"{base_uri}/out")


def test_run_without_sink_is_a_spec_error(base_uri):
    _corpus(base_uri)
    spec = _spec(base_uri)
    del spec["sink"]
    with pytest.raises(SpecError, match="missing required key 'sink'"):
        Pipeline(spec).run()


def test_placement_option_constrains_the_whole_execution(ray_cluster, base_uri):
    from slicefeed.pipelines import placement_label_selector

    _corpus(base_uri)
    ds = Pipeline(_spec(base_uri, placement={"preprocess_on": "cpu_only"})).dataset()
    assert ds.context.execution_options.label_selector == placement_label_selector("cpu_only")
    # On this CPU-only cluster every node qualifies, so the job still runs.
    assert ds.count() == 25
    ds = Pipeline(_spec(base_uri, placement={"preprocess_on": "any"})).dataset()
    assert not ds.context.execution_options.label_selector
    with pytest.raises(SpecError, match=r"placement.preprocess_on is 'tpu'; allowed values: cpu_only, any"):
        Pipeline(_spec(base_uri, placement={"preprocess_on": "tpu"}))


@pytest.mark.slow
def test_rerun_decided_from_listing_files_and_format_version(ray_cluster, base_uri, monkeypatch):
    """decide() (no Ray): same input -> nothing to do; a new file or a new version -> refused."""
    from slicefeed.pipelines import _rerun

    _corpus(base_uri)
    assert Pipeline(_spec(base_uri)).run().status == "committed"
    m = read_manifest(f"{base_uri}/out")
    assert len(m.inputs) == 3 and all(i.size and i.generation for i in m.inputs)
    assert Pipeline(_spec(base_uri)).decide().status == "already_committed"
    put_bytes(f"{base_uri}/raw/f9.jsonl", json.dumps({"id": 99, "score": "1", "text": "x"}) + "\n")
    with pytest.raises(AlreadyCommittedError,
                       match=r"from other input: 1 input file added since the committed run "
                             r"\(e\.g\. .*f9\.jsonl\)\. Pass --overwrite"):
        Pipeline(_spec(base_uri)).decide()
    extra = resolve_filesystem(f"{base_uri}/raw/f9.jsonl")
    extra.fs.rm(extra.path)
    assert Pipeline(_spec(base_uri)).decide().status == "already_committed"
    monkeypatch.setattr(_rerun, "OUTPUT_FORMAT_VERSION", _rerun.OUTPUT_FORMAT_VERSION + 1)
    with pytest.raises(AlreadyCommittedError, match="the output format version changed"):
        Pipeline(_spec(base_uri)).decide()
    assert Pipeline(_spec(base_uri)).decide(overwrite=True) is None


@pytest.mark.slow
def test_rows_removed_by_deduplicate_are_counted_as_filtered(ray_cluster, local_dir):
    """deduplicate is a dataset-level op, not a batch stage: its removed rows are
    reported in filtered_by under its name and in rows_filtered, so the report's
    identity holds with and without packing after it, and with deduplicate first,
    last and twice in a row (its rows are counted by the stages next to it)."""
    import os

    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": i, "text": f"doc{i % 20}", "g": i % 4}) + "\n"
                     for i in range(60))
    spec = {"name": "dedup2", "source": {"format": "jsonl", "uri": raw},
            "transforms": [{"deduplicate": {"columns": ["text"], "partitions": 4}},
                           {"deduplicate": {"columns": ["g"], "partitions": 4}}],
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out2")}}
    r = Pipeline(spec).run()
    assert (r.rows_read, r.rows_written, r.rows_filtered) == (60, 4, 56)
    assert r.filtered_by == {"deduplicate": 56}, r.filtered_by
    for packed in (False, True):
        transforms = [{"filter": {"expr": "id >= 5"}}, {"deduplicate": {"columns": ["text"], "partitions": 4}},
                      {"tokenize": {"column": "text", "tokenizer": "bytes"}}]
        if packed:
            transforms.append({"pack_sequences": {"column": "tokens", "seq_len": 16}})
        spec = {"name": f"dedup{int(packed)}", "source": {"format": "jsonl", "uri": raw},
                "transforms": transforms,
                "sink": {"format": "parquet", "uri": os.path.join(local_dir, f"out{int(packed)}")}}
        r = Pipeline(spec).run()
        assert r.filtered_by == {"filter": 5, "deduplicate": 35}, (packed, r.filtered_by)
        assert r.rows_filtered == 40 and r.rows_read == 60
        if packed:
            pack = r.reshaped["pack_sequences"]
            assert pack["rows_in"] == 20
            assert r.rows_read == r.rows_filtered + r.rows_skipped + r.rows_quarantined + pack["rows_in"]
        else:
            assert r.rows_written == 20
            assert r.rows_read == r.rows_written + r.rows_filtered + r.rows_skipped + r.rows_quarantined
