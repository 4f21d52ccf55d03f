"""What a rerun decides from storage alone: the fingerprint's parts and the change message."""

from __future__ import annotations

import dataclasses

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
