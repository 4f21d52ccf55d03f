"""What a rerun decides from storage alone: the fingerprint's parts and the change message."""

from __future__ import annotations

import dataclasses

import pytest

from slicefeed.connectors import AlreadyCommittedError
from slicefeed.pipelines._rerun import (
    OUTPUT_FORMAT_VERSION,
    combine,
    describe_input_changes,
    fingerprint_parts,
    transform_file_digests,
    what_changed,
)


@dataclasses.dataclass(frozen=True)
class _In:  # the shape of an input-listing entry: uri, size, generation
    uri: str
    size: int | None
    generation: str | None = None


def test_change_message_counts_added_changed_removed():
    old = [_In("gs://b/raw/a.jsonl", 10, "1"), _In("gs://b/raw/b.jsonl", 20, "1"),
           _In("gs://b/raw/gone.jsonl", 5, "1")]
    new = [_In("gs://b/raw/a.jsonl", 10, "2"), _In("gs://b/raw/b.jsonl", 20, "1"),
           _In("gs://b/raw/c.jsonl", 1, "1"), _In("gs://b/raw/d.jsonl", 1, "1")]
    msg = describe_input_changes(old, new)
    assert msg.startswith("2 input files added, 1 changed, 1 removed since the committed run")
    assert "gs://b/raw/c.jsonl" in msg
    assert describe_input_changes(old, old) == "the input listing is the same"
    assert describe_input_changes(old[:1], old[:2]).startswith(
        "1 input file added since the committed run")
    # The listing's order does not matter; a size or generation change does.
    same = fingerprint_parts("s", list(reversed(old)), {})
    assert combine(fingerprint_parts("s", old, {})) == combine(same)
    assert combine(fingerprint_parts("s", new, {})) != combine(same)


def test_file_a_transform_reads_is_part_of_the_fingerprint(tmp_path):
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"model": 1}')
    spec = {"transforms": [{"tokenize": {"column": "text", "tokenizer": str(tok)}},
                           {"tokenize": {"column": "t2", "tokenizer": "bytes"}}]}
    first = transform_file_digests(spec)
    assert list(first) == [str(tok)]
    tok.write_text('{"model": 2}')
    second = transform_file_digests(spec)
    assert first != second
    a, b = fingerprint_parts("s", [], first), fingerprint_parts("s", [], second)
    assert combine(a) != combine(b)
    assert what_changed(a, b, [], []) == [
        f"the content of {tok} (read by a transform) changed"]


def test_format_version_is_part_of_the_fingerprint():
    parts = fingerprint_parts("s", [], {})
    assert parts["format_version"] == OUTPUT_FORMAT_VERSION
    old = dict(parts, format_version=OUTPUT_FORMAT_VERSION - 1)
    assert combine(old) != combine(parts)
    assert what_changed(old, parts, [], []) == [
        (f"the output format version changed (committed: {OUTPUT_FORMAT_VERSION - 1}, "
        f"this slicefeed: {OUTPUT_FORMAT_VERSION})")]


def test_dataset_whose_listing_held_unread_files_is_still_committed(ray_cluster, local_dir):
    """slicefeed used to list a folder's files not named for its format (never
    read) in the fingerprint and the manifest's inputs. Once they left the
    listing, the rerun of such a dataset on unchanged input was refused as
    "committed by this pipeline from other input: 1 input file removed"."""
    import json
    import os

    from slicefeed.connectors import read_manifest
    from slicefeed.connectors._manifest import InputFile, version_name
    from slicefeed.pipelines import Pipeline
    from slicefeed.pipelines._rerun import PARTS_KEY, listing_digest

    raw, out = os.path.join(local_dir, "raw"), os.path.join(local_dir, "out")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.write("".join(json.dumps({"id": i}) + "\n" for i in range(5)))
    with open(os.path.join(raw, "README.md"), "w") as f:
        f.write("notes\n")
    spec = {"name": "t", "source": {"format": "jsonl", "uri": raw},
            "sink": {"format": "parquet", "uri": out}}
    Pipeline(spec).run()
    m = read_manifest(out)
    # The same commit as the earlier listing recorded it: README.md listed too.
    readme = os.path.join(raw, "README.md")
    inputs = (*m.inputs, InputFile(readme, 6, str(os.stat(readme).st_mtime_ns)))
    parts = {**m.metadata[PARTS_KEY], "inputs": listing_digest(inputs)}
    legacy = dataclasses.replace(m, inputs=inputs, fingerprint=combine(parts), version=2, parent=1,
                                 metadata={**m.metadata, PARTS_KEY: parts})
    with open(os.path.join(out, version_name(2)), "w") as f:
        f.write(legacy.to_json())
    assert read_manifest(out).fingerprint != m.fingerprint
    report = Pipeline(spec).decide()
    assert report is not None and report.status == "already_committed"
    # A file of the format added since is new input all the same.
    with open(os.path.join(raw, "b.jsonl"), "w") as f:
        f.write('{"id": 9}\n')
    with pytest.raises(AlreadyCommittedError, match="1 input file added"):
        Pipeline(spec).decide()


def _rows(uri: str) -> list[dict]:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from slicefeed.connectors import read_manifest

    m = read_manifest(uri)
    return pa.concat_tables([pq.read_table(os.path.join(uri, f.path)) for f in m.files]).to_pylist()


def _two_line_corpus_and_tokenizer(local_dir: str, tok_name: str):
    """A folder with one JSONL file of two texts, the path of a tokenizer.json,
    and ``save(vocab)``, which writes a word-level tokenizer of ``vocab`` there."""
    import json
    import os

    from tokenizers import Tokenizer, models, pre_tokenizers

    raw, tok_path = os.path.join(local_dir, "raw"), os.path.join(local_dir, tok_name)
    os.makedirs(raw)
    with open(os.path.join(raw, "a.jsonl"), "w") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in ["hello world", "world hello"]))

    def save(vocab):
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(tok_path)

    return raw, tok_path, save


def test_replaced_tokenizer_json_is_used_by_the_next_run_in_the_same_process(
        ray_cluster, local_dir):
    """A tokenizer.json replaced between two runs of one process (a notebook, a
    scheduler) tokenizes the second run: neither the driver nor the Ray workers
    may keep the first file's tokenizer, since the manifest records the new
    file's digest."""
    import os

    from slicefeed.pipelines import Pipeline

    raw, tok_path, save = _two_line_corpus_and_tokenizer(local_dir, "tokenizer.json")
    spec = {"name": "tok", "source": {"format": "jsonl", "uri": raw},
            "transforms": [{"tokenize": {"column": "text", "tokenizer": tok_path}}],
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}
    save({"[UNK]": 0, "hello": 1, "world": 2})
    Pipeline(spec).run()
    assert sorted(r["tokens"] for r in _rows(spec["sink"]["uri"])) == [[1, 2], [2, 1]]
    save({"[UNK]": 0, "hello": 10, "world": 20})  # same path and size class, new ids
    with pytest.raises(AlreadyCommittedError, match="tokenizer.json .read by a transform. changed"):
        Pipeline(spec).decide()
    assert Pipeline(spec).run(overwrite=True).status == "committed"
    assert sorted(r["tokens"] for r in _rows(spec["sink"]["uri"])) == [[10, 20], [20, 10]]
    assert Pipeline(spec).decide().status == "already_committed"


def test_pipeline_dataset_tokenizes_with_the_tokenizer_json_it_was_planned_with(
        ray_cluster, local_dir):
    """``Pipeline.dataset()`` (what a loader streams) checked the tokenizer.json
    on every batch and used whatever it held then, so a file replaced while the
    dataset streamed mixed two tokenizers in one epoch. It now reads the file
    once when planned; a worker that must read it again refuses other content."""
    from slicefeed.pipelines import Pipeline

    raw, tok_path, save = _two_line_corpus_and_tokenizer(local_dir, "tok-ds.json")
    spec = {"name": "tokds", "source": {"format": "jsonl", "uri": raw},
            "transforms": [{"tokenize": {"column": "text", "tokenizer": tok_path}}]}
    save({"[UNK]": 0, "hello": 3, "world": 4, "planned": 5})
    ds = Pipeline(spec).dataset()
    save({"[UNK]": 0, "hello": 30, "world": 40})  # replaced before any batch ran
    with pytest.raises(Exception, match=r"tok-ds\.json changed after the run was planned"):
        ds.take_all()
    ds = Pipeline(spec).dataset()  # planned now: the current content
    assert sorted(r["tokens"] for r in ds.take_all()) == [[30, 40], [40, 30]]


def _image_spec(local_dir: str) -> dict:
    import os

    import numpy as np
    from PIL import Image

    images, labels = os.path.join(local_dir, "images"), os.path.join(local_dir, "labels")
    os.makedirs(images)
    os.makedirs(labels)
    for name, v in (("a.png", 10), ("b.png", 20)):
        Image.fromarray(np.full((4, 4, 3), v, np.uint8)).save(os.path.join(images, name))
    with open(os.path.join(labels, "labels.csv"), "w") as f:
        f.write("path,label\na.png,0\nb.png,1\n")
    return {"name": "img", "source": {"format": "csv", "uri": os.path.join(labels, "labels.csv")},
            "transforms": [{"decode_image": {"column": "path", "output": "image", "root": images,
                                             "mode": "RGB"}},
                           {"select": {"columns": ["image", "label"]}}],
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}


def test_image_replaced_under_decode_image_root_is_a_change(ray_cluster, local_dir):
    """decode_image reads files under its root: a replaced image (same name,
    other pixels) makes the committed dataset stale, so a rerun is refused
    with a message naming the root folder, and --overwrite recomputes it."""
    import os

    import numpy as np
    from PIL import Image

    from slicefeed.pipelines import Pipeline

    spec = _image_spec(local_dir)
    images, out = spec["transforms"][0]["decode_image"]["root"], spec["sink"]["uri"]
    Pipeline(spec).run()
    assert Pipeline(spec).decide().status == "already_committed"  # unchanged: nothing to do
    Image.fromarray(np.full((6, 6, 3), 200, np.uint8)).save(os.path.join(images, "a.png"))
    with pytest.raises(AlreadyCommittedError) as e:
        Pipeline(spec).decide()
    msg = str(e.value)
    assert "1 file changed" in msg and images in msg and "read by a transform" in msg, msg
    assert "input file" not in msg, msg
    assert Pipeline(spec).run(overwrite=True).status == "committed"
    pixels = {r["label"]: r["image"]["pixels"][0][0] for r in _rows(out)}
    assert pixels == {0: 200, 1: 20}
    assert Pipeline(spec).decide().status == "already_committed"
    # A file added to and one removed from the root are counted too.
    Image.fromarray(np.full((4, 4, 3), 1, np.uint8)).save(os.path.join(images, "c.png"))
    os.remove(os.path.join(images, "b.png"))
    with pytest.raises(AlreadyCommittedError, match="1 file added, 1 removed"):
        Pipeline(spec).decide()


def test_folder_listing_covers_every_file_and_its_generation(base_uri):
    """The listing of a folder a transform reads: relative path, size and
    generation (GCS) or mtime_ns (local) of every file, hidden ones included;
    a replaced file changes it without any file being read."""
    import time

    from slicefeed.connectors._commit import list_folder
    from tests._harness import put_bytes

    root = f"{base_uri}/images"
    assert list_folder(root) == ()  # not there yet: an empty listing
    put_bytes(f"{root}/a.png", b"a")
    put_bytes(f"{root}/sub dir/.b.png", b"bb")
    first = list_folder(root)
    assert [(f.uri, f.size) for f in first] == [("a.png", 1), ("sub dir/.b.png", 2)]
    assert all(f.generation for f in first)
    time.sleep(0.01)
    put_bytes(f"{root}/a.png", b"c")  # same name and size, new content
    second = list_folder(root)
    assert [f.uri for f in second] == ["a.png", "sub dir/.b.png"] and second != first


def test_folder_change_message_is_bounded_and_counts_files():
    from slicefeed.pipelines._rerun import MAX_STORED_FOLDER_FILES, folder_metadata

    root = "gs://b/images"
    old = {root: [_In("a.png", 1, "1"), _In("b.png", 1, "1")]}
    new = {root: [_In("a.png", 1, "2"), _In("c.png", 1, "1")]}
    a, b = fingerprint_parts("s", [], {}, old), fingerprint_parts("s", [], {}, new)
    assert "folders" not in fingerprint_parts("s", [], {}, {})  # other specs: as before
    assert combine(a) != combine(b)
    assert what_changed(a, b, [], [], folder_metadata(old), folder_metadata(new)) == [
        (f"the files under {root} (read by a transform) changed: 1 file added, 1 changed, "
        "1 removed since the committed run (e.g. c.png)")]
    many = {root: [_In(f"{i}.png", 1, "1") for i in range(MAX_STORED_FOLDER_FILES + 1)]}
    assert folder_metadata(many)[root] == {"files": MAX_STORED_FOLDER_FILES + 1, "listing": None}
    c = fingerprint_parts("s", [], {}, many)
    assert what_changed(a, c, [], [], folder_metadata(old), folder_metadata(many)) == [
        (f"the files under {root} (read by a transform) changed (2 files committed, "
        f"{MAX_STORED_FOLDER_FILES + 1} now)")]
    # Committed before folders were fingerprinted: said so.
    before = fingerprint_parts("s", [], {})
    assert what_changed(before, a, [], [], None, folder_metadata(old)) == [
        (f"the files under {root} (read by a transform) were not part of the committed "
        "run's fingerprint")]


def test_sink_inside_decode_image_root_is_not_a_change(ray_cluster, local_dir):
    """A sink written under decode_image's root changes with every commit; it
    is left out of the root's listing, so an unchanged rerun has nothing to do."""
    import os

    from slicefeed.pipelines import Pipeline

    spec = _image_spec(local_dir)
    spec["sink"]["uri"] = os.path.join(spec["transforms"][0]["decode_image"]["root"], "out")
    Pipeline(spec).run()
    assert Pipeline(spec).decide().status == "already_committed"


# -- a spec that means the same is the same pipeline ---------------------------------------
#
# One committed run (module fixture); every variant below is decided against it from
# storage alone (``Pipeline.decide()``, what ``slicefeed run`` calls before Ray starts).

def _set(path: str, value):
    """A variant of the spec: ``path`` ("transforms.0.filter.expr") set to ``value``
    (a callable gets the old value)."""
    def edit(spec: dict) -> dict:
        import copy

        spec = copy.deepcopy(spec)
        keys = path.split(".")
        node = spec
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        last = int(keys[-1]) if isinstance(node, list) else keys[-1]
        node[last] = value(node[last]) if callable(value) else value
        return spec
    return edit


def _all(*edits):
    def edit(spec: dict) -> dict:
        for e in edits:
            spec = e(spec)
        return spec
    return edit


_SAME = {
    "source path with a trailing slash": _set("source.uri", lambda u: u + "/"),
    "source path with ./ and a doubled slash": _set(
        "source.uri", lambda u: u.replace("/raw", "/./raw").replace("/data set", "//data set")),
    "sink path with a trailing slash": _set("sink.uri", lambda u: u + "/"),
    "filter spaced": _set("transforms.0.filter.expr", "text != 'b'"),
    "filter parenthesised, other quotes": _set("transforms.0.filter.expr", '( text!="b" )'),
    "transform defaults written out": _set(
        "transforms.1.hash_bucket", lambda a: {**a, "salt": "", "output": None}),
    "source option default written out": _set("source.options", {"drop_empty_lines": False}),
    "spec defaults written out": _all(_set("seed", 0), _set("on_error", "fail"),
                                      _set("max_error_fraction", 0)),
}
_SAME["all of them"] = _all(*_SAME.values())

_OTHER = {
    "another filter constant": _set("transforms.0.filter.expr", "text != 'c'"),
    "another filter operator": _set("transforms.0.filter.expr", "text == 'b'"),
    "another transform option": _set("transforms.1.hash_bucket.num_buckets", 5),
    "another transform option, not a default": _set("transforms.1.hash_bucket.salt", "x"),
    "another source option": _set("source.options", {"drop_empty_lines": True}),
    "another source folder": _set("source.uri", lambda u: u + "2"),
    "another seed": _set("seed", 1),
    "another policy": _set("on_error", "skip"),
}


@pytest.fixture(scope="module")
def committed_text(ray_cluster, tmp_path_factory) -> dict:
    """A committed run of a small text pipeline; returns its spec."""
    import os

    from slicefeed.pipelines import Pipeline

    base = str(tmp_path_factory.mktemp("forms") / "data set")
    raw = os.path.join(base, "raw")
    os.makedirs(raw)
    os.makedirs(raw + "2")
    for folder in (raw, raw + "2"):
        with open(os.path.join(folder, "a.txt"), "w") as f:
            f.write("a\nb\n\nc\n")
    spec = {"name": "forms", "source": {"format": "text", "uri": raw},
            "transforms": [{"filter": {"expr": "text!='b'"}},
                           {"hash_bucket": {"column": "text", "num_buckets": 4}}],
            "sink": {"format": "parquet", "uri": os.path.join(base, "out")}}
    report = Pipeline(spec).run()
    assert report.status == "committed" and report.rows_written == 3
    return spec


@pytest.mark.parametrize("variant", list(_SAME), ids=list(_SAME))
def test_spec_written_differently_is_the_same_pipeline(committed_text, variant):
    """A spec that means what the committed one means (paths normalised,
    expressions by their parsed form, defaults filled in): nothing to do."""
    from slicefeed.pipelines import Pipeline

    report = Pipeline(_SAME[variant](committed_text)).decide()
    assert report is not None and report.status == "already_committed", variant
    assert report.rows_written == 3


@pytest.mark.parametrize("variant", list(_OTHER), ids=list(_OTHER))
def test_spec_that_can_change_a_value_is_another_pipeline(committed_text, variant):
    from slicefeed.pipelines import Pipeline

    with pytest.raises(AlreadyCommittedError, match="written by another pipeline"):
        Pipeline(_OTHER[variant](committed_text)).decide()


def test_equivalent_spec_through_the_cli(committed_text, tmp_path):
    """`slicefeed run` of the spec written differently: exit 0, nothing to do;
    another sink is another dataset (nothing committed there: it would run)."""
    import os

    import yaml

    from slicefeed.pipelines import Pipeline
    from tests._harness import run_slicefeed

    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(_SAME["all of them"](committed_text)))
    r = run_slicefeed("run", str(path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "already committed with this pipeline's fingerprint (3 rows)" in r.stdout, r.stdout
    r = run_slicefeed("run", str(path), "--set", "transforms.0.filter.expr=text != 'c'")
    assert r.returncode == 2 and "written by another pipeline" in r.stderr, r.stderr[-2000:]
    other_sink = _set("sink.uri", lambda u: os.path.join(os.path.dirname(u), "out2"))
    assert Pipeline(other_sink(committed_text)).decide() is None


def _as_written_fingerprint(spec: dict) -> str:
    """The spec fingerprint as slicefeed computed it before specs were normalised:
    SHA-256 of the validated spec's sources, transforms, seed and policy as written."""
    import hashlib
    import json

    from slicefeed.pipelines import validate_spec

    spec = validate_spec(spec)
    doc = {"sources": [{k: v for k, v in s.items() if k != "storage"}
                       for s in ([spec["source"]] if "source" in spec else spec["sources"])],
           "transforms": spec["transforms"], "seed": spec["seed"], "on_error": spec["on_error"],
           "max_error_fraction": spec["max_error_fraction"]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _commit_as_written(out: str, spec: dict, sizes: list[int]) -> None:
    """Commits ``out`` as a slicefeed before specs were normalised would have
    for ``spec``: shards written by pyarrow (``sizes`` rows each; decide() does
    not read them) and a manifest whose fingerprint parts hold the spec as
    written and no ``spec_form``."""
    import os

    from slicefeed.connectors import read_manifest
    from slicefeed.connectors._manifest import version_name
    from slicefeed.pipelines import Pipeline
    from slicefeed.pipelines._rerun import PARTS_KEY
    from tests.pipelines._data import write_committed

    write_committed(out, sizes)
    parts, inputs = Pipeline(spec).fingerprint_parts()
    old_parts = {"spec": _as_written_fingerprint(spec), "inputs": parts["inputs"],
                 "files": parts["files"], "format_version": parts["format_version"]}
    legacy = dataclasses.replace(read_manifest(out), fingerprint=combine(old_parts), inputs=inputs,
                                 metadata={"pipeline": "old", PARTS_KEY: old_parts})
    with open(os.path.join(out, version_name(1)), "w") as f:
        f.write(legacy.to_json())


def test_dataset_committed_before_specs_were_normalised(local_dir):
    """A sink committed by a slicefeed that fingerprinted the spec as written
    (its parts have no ``spec_form``): the spec as written then is still "nothing
    to do"; one written differently cannot be recognised from that fingerprint, and
    the refusal says so instead of calling it another pipeline outright."""
    import os

    from slicefeed.pipelines import Pipeline

    raw, out = os.path.join(local_dir, "raw"), os.path.join(local_dir, "out")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.txt"), "w") as f:
        f.write("a\nb\n\nc\n")
    spec = {"name": "old", "source": {"format": "text", "uri": raw},
            "transforms": [{"filter": {"expr": "text!='b'"}}],
            "sink": {"format": "parquet", "uri": out}}
    _commit_as_written(out, spec, [3])

    report = Pipeline(spec).decide()
    assert report is not None and report.status == "already_committed"
    with pytest.raises(AlreadyCommittedError) as e:
        Pipeline(_set("transforms.0.filter.expr", "text != 'b'")(spec)).decide()
    msg = str(e.value)
    assert "committed by an earlier slicefeed" in msg and "--overwrite" in msg, msg
    # The input changed since: said so, as before.
    with open(os.path.join(raw, "b.txt"), "w") as f:
        f.write("d\n")
    with pytest.raises(AlreadyCommittedError, match="1 input file added"):
        Pipeline(spec).decide()
    assert Pipeline(spec).decide(overwrite=True) is None


def test_csv_delimiter_written_out_is_the_default_only_where_the_names_are_known(local_dir):
    """CSV's delimiter is chosen by each file's name (tab for .tsv). Over one
    file named .csv, ``delimiter: ","`` is the default written out; over a
    folder (even one named ``x.csv``, whose .tsv files are read with tabs) it
    is another pipeline: the spec part of the fingerprint says so."""
    import os

    from slicefeed.pipelines import Pipeline

    one = os.path.join(local_dir, "one.csv")
    folder = os.path.join(local_dir, "folder.csv")
    os.makedirs(folder)
    for path in (one, os.path.join(folder, "a.tsv")):
        with open(path, "w") as f:
            f.write("a,b\n1,2\n")

    def spec_part(uri, **options):
        spec = {"name": "csv", "source": {"format": "csv", "uri": uri, "options": options},
                "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}
        return Pipeline(spec).fingerprint_parts()[0]["spec"]

    assert spec_part(one) == spec_part(one, delimiter=",") != spec_part(one, delimiter=";")
    assert spec_part(folder) != spec_part(folder, delimiter=",")
    assert spec_part(folder) == spec_part(folder + "/")


def test_csv_delimiter_over_a_folder_named_with_glob_characters(local_dir):
    """A URI with glob characters that names an existing folder is read as that
    folder (``expand_paths``: a path that exists is not a glob), so its files'
    own names choose the delimiter: over a folder ``[x].tsv`` holding ``a.csv``,
    the file is read with commas, and ``delimiter: "\\t"`` reads it otherwise:
    another pipeline. A glob ``*.tsv``, whose matches are all ``.tsv`` files,
    still has the tab written out as its default."""
    import os

    from slicefeed.pipelines import Pipeline

    folder = os.path.join(local_dir, "[x].tsv")
    os.makedirs(folder)
    with open(os.path.join(folder, "a.csv"), "w") as f:
        f.write("a,b\n1,2\n")
    with open(os.path.join(local_dir, "b.tsv"), "w") as f:
        f.write("a\tb\n1\t2\n")

    def spec_part(uri, **options):
        spec = {"name": "csv", "source": {"format": "csv", "uri": uri, "options": options},
                "sink": {"format": "parquet", "uri": os.path.join(local_dir, "out")}}
        return Pipeline(spec).fingerprint_parts()[0]["spec"]

    assert spec_part(folder) != spec_part(folder, delimiter="\t")
    assert spec_part(folder) == spec_part(folder + "/")
    pattern = os.path.join(local_dir, "*.tsv")
    assert spec_part(pattern) == spec_part(pattern, delimiter="\t") != spec_part(pattern, delimiter=",")


def test_dataset_committed_before_specs_were_normalised_with_a_timestamp(local_dir):
    """The spec digest of an earlier slicefeed wrote a YAML timestamp as the text a
    string has, so a dataset it committed from ``fill_null`` with the string cannot
    be told from one with the timestamp (which writes another value): the rerun is
    refused, not "nothing to do"."""
    import os

    from slicefeed.pipelines import Pipeline
    from slicefeed.pipelines._spec import safe_load_yaml

    raw, out = os.path.join(local_dir, "raw"), os.path.join(local_dir, "out")
    os.makedirs(raw)
    with open(os.path.join(raw, "a.txt"), "w") as f:
        f.write("a\n")

    def spec(value: str) -> dict:
        return {"name": "old", "source": {"format": "text", "uri": raw},
                "transforms": safe_load_yaml(f"[fill_null: {{values: {{text: {value}}}}}]"),
                "sink": {"format": "parquet", "uri": out}}

    text, stamp = spec("'2024-01-01 10:00:00'"), spec("2024-01-01 10:00:00")
    _commit_as_written(out, text, [1])

    assert Pipeline(text).decide().status == "already_committed"
    with pytest.raises(AlreadyCommittedError, match="YAML date or timestamp"):
        Pipeline(stamp).decide()
