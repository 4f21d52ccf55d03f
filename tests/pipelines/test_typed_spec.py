"""Typed specs: one frozen PipelineSpec built after validation; typed stage counters."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from slicefeed.connectors import SpecError
from slicefeed.pipelines import Pipeline, load_spec, validate_spec
from slicefeed.pipelines._pipeline import StageCounts, TransformCounts
from slicefeed.pipelines._spec import PipelineSpec, SinkSpec, SourceSpec, parse_spec

MIXTURE = {
    "name": "mix",
    "seed": 3,
    "sources": [
        {"name": "web", "format": "jsonl", "uri": "/data/web", "weight": 2},
        {"format": "csv", "uri": "/data/t.tsv", "options": {"delimiter": "\t"},
         "storage": {"anonymous": True}},
    ],
    "transforms": [{"select": {"columns": ["text"]}}],
    "sink": {"format": "parquet", "uri": "/out", "options": {"compression": "zstd"}},
    "on_error": "skip",
    "max_error_fraction": 0.25,
    "placement": {"preprocess_on": "cpu_only"},
}


def test_parse_spec_types_every_field():
    spec = parse_spec(MIXTURE)
    assert spec.name == "mix" and spec.seed == 3 and spec.is_mixture
    web, tsv = spec.sources
    assert web == SourceSpec(format="jsonl", uri="/data/web", name="web", weight=2.0)
    assert tsv.options == {"delimiter": "\t"} and tsv.storage == {"anonymous": True}
    assert spec.source_names == ["web", "1"]
    assert spec.sink == SinkSpec(format="parquet", uri="/out", options={"compression": "zstd"})
    assert spec.on_error == "skip" and spec.max_error_fraction == 0.25
    assert spec.preprocess_on == "cpu_only"
    assert spec.transforms == ({"select": {"columns": ["text"]}},)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 4  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_typed_spec_does_not_alias_the_dict_and_keeps_the_dict_api(tmp_path):
    raw = {"name": "one", "source": {"format": "text", "uri": "/x"}}
    spec = parse_spec(raw)
    assert not spec.is_mixture and spec.sink is None and spec.seed == 0
    assert validate_spec(raw)["on_error"] == "fail"  # the dict API is unchanged
    raw["source"]["uri"] = "/changed"
    assert spec.sources[0].uri == "/x"
    path = tmp_path / "p.yaml"
    path.write_text("name: y\nsource: {format: jsonl, uri: /y}\n")
    assert isinstance(load_spec(path), dict)
    with pytest.raises(SpecError, match="allowed values"):
        parse_spec({"name": "z", "source": {"format": "xml", "uri": "/z"}})


def test_pipeline_reads_the_typed_spec():
    p = Pipeline(MIXTURE)
    assert isinstance(p.spec, PipelineSpec) and p.name == "mix"
    assert p.fingerprint == parse_spec(MIXTURE).fingerprint
    params = inspect.signature(Pipeline.dataset).parameters
    assert [n for n in params if n.startswith("_")] == []


def test_stage_counts_add_up():
    a = StageCounts(rows_read=10, rows_skipped=1)
    a.transforms[0] = TransformCounts(0, "filter", rows_in=9, rows_out=7)
    a.transforms[1] = TransformCounts(1, "pack_sequences", reshapes_rows=True, rows_in=7,
                                      rows_out=2, slots=8, tokens=6)
    b = StageCounts(rows_quarantined=3, rows_out=2, bytes_out=64)
    b.transforms[0] = TransformCounts(0, "filter", rows_in=4, rows_out=3, rows_bad=1)
    a.add(b)
    assert (a.rows_read, a.rows_bad, a.rows_out, a.bytes_out) == (10, 4, 2, 64)
    assert a.filtered_by() == {"filter": 2}
    assert a.reshaped() == {"pack_sequences": {"rows_in": 7, "rows_out": 2}}
    rows = a.transform_rows()
    assert [r["name"] for r in rows] == ["filter", "pack_sequences"]
    assert rows[0]["rows_in"] == 13 and rows[0]["rows_bad"] == 1
    assert rows[1]["packing_efficiency"] == 0.75
    assert not StageCounts() and a
