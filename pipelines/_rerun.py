"""What a rerun of a batch job must do, decided from storage alone (no Ray).

A committed run's fingerprint covers everything that determines its output:

- the spec (sources, transforms, seed, bad-record policy; not the sink), by
  what it means (:func:`slicefeed.pipelines._spec.canonical_spec`: paths
  normalised, expressions by their parsed form, defaults filled in), so a
  spec written differently is the same pipeline; ``spec_form`` says so;
- the resolved input listing: every input file's path, size and storage
  generation (GCS) or modification time (local), stored in the manifest so
  a rerun can say what changed;
- the content of files the transforms read (a ``tokenizer.json``);
- the listing of each folder a transform reads files from (``decode_image``'s
  ``root``): every file's relative path, size and generation or mtime, like
  the input listing; one listing per decide, no file is opened;
- :data:`OUTPUT_FORMAT_VERSION`, bumped whenever the rows a pipeline writes
  for the same input change (a transform's semantics, the shard layout), not
  with every package release.

``decide()`` compares those with what the sink's manifest recorded: the
same -> nothing to do; anything else -> refused (without ``overwrite``),
with a message that says what changed and how to proceed.

A dataset committed before specs were normalised has no ``spec_form`` in its
parts: its spec part is the digest of the spec as written
(:func:`~slicefeed.pipelines._spec.written_fingerprint`). Its rerun is decided
from this run's parts in that form (:func:`as_written_form`): the spec as
written then is still "nothing to do" (nothing is recomputed for the change),
and a spec written differently, which that digest cannot recognise, is refused
with a message that says so. Its output is the same, so this is no output
format change: :data:`OUTPUT_FORMAT_VERSION` stays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Version of what a pipeline writes for a given spec and input. Bump it when
#: the output rows or their layout change, so reruns over unchanged input
#: recompute instead of reporting "nothing to do".
#: 2: fixed-shape outputs are ``arrow.fixed_shape_tensor`` columns (were
#: ``fixed_size_list``); ``pad_or_truncate``'s mask is uint8 (was bool).
#: 3: CSV: a written NaN is NaN (was null); a hexadecimal number (``0x1F``)
#: arrives as the strings written (was an integer). Parquet: INT96 timestamps
#: are microseconds (were nanoseconds, wrapping past 2262). ``filter``: ``/``
#: divides to float64 (integers were truncated). ``cast``: rows of a list
#: column without a bad value are kept, a float that overflows is a bad row
#: (was inf). ``pad_or_truncate``/``pack_sequences``: a null inside a list, and
#: (packing) an id outside int32, is a bad row (was written as garbage or
#: wrapped). Scalers: NaN skipped in the fit (was a 0 statistic), a constant
#: column maps to 0. ``deduplicate``: 0.0 and -0.0 are one key.
#: ``decode_image``: 16-bit greyscale is scaled to 8 bits (was clamped), 32-bit
#: and float images are bad rows. Mixtures: counts are exactly floor(p_i*T),
#: and their rows are split into blocks fixed by the counts (packing after a
#: mixture depended on the sort's sampled block boundaries).
OUTPUT_FORMAT_VERSION = 3

#: How the spec part is computed: 2, the spec's meaning
#: (:func:`~slicefeed.pipelines._spec.canonical_spec`). Parts without it (1)
#: hold the digest of the spec as written.
SPEC_FORM = 2

#: Manifest metadata key holding the fingerprint's parts (for "what changed").
PARTS_KEY = "fingerprint_parts"
#: Manifest metadata key holding the listings of folders transforms read
#: (``{uri: {"files": n, "listing": [[path, size, generation], ...] | null}}``),
#: for "what changed" only; the fingerprint holds their digests.
FOLDERS_KEY = "folder_listings"
#: A folder listing of more files than this is not stored in the manifest
#: (which stays small); its change is then reported by file counts only.
MAX_STORED_FOLDER_FILES = 10_000

_FILE_SUFFIXES = (".json", ".model", ".txt", ".vocab", ".bin", ".yaml", ".yml")


def _looks_like_file(value: str) -> bool:
    return "://" in value or "/" in value or value.lower().endswith(_FILE_SUFFIXES)


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def transform_file_digests(spec: Mapping[str, Any]) -> dict[str, str]:
    """SHA-256 of each existing file a transform's arguments name (``tokenizer.json``).

    Any string argument that looks like a path or URI and names an existing
    file counts; others (``tokenizer: bytes``, column names) are ignored.
    """
    from slicefeed.connectors import resolve_filesystem

    out: dict[str, str] = {}
    for item in spec.get("transforms") or []:
        for value in _strings(item):
            if value in out or not _looks_like_file(value):
                continue
            try:
                r = resolve_filesystem(value)
                if not r.fs.isfile(r.path):
                    continue
                h = hashlib.sha256()
                with r.fs.open(r.path, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
            except (OSError, ValueError):
                continue
            out[value] = h.hexdigest()
    return out


def transform_folder_listings(transforms: Iterable[Any], *, sink: str | None = None
                              ) -> dict[str, tuple[Any, ...]]:
    """The listing of each folder the transforms read files from, by its URI.

    See ``Transform.folders_read``; one recursive listing per folder. A sink
    inside such a folder is left out of its listing: each commit changes it.
    """
    from slicefeed.connectors._commit import list_folder

    out: dict[str, tuple[Any, ...]] = {}
    for t in transforms:
        for uri, storage in t.folders_read():
            if uri not in out:
                out[uri] = list_folder(uri, exclude=() if sink is None else (sink,), **storage)
    return out


@dataclasses.dataclass(frozen=True)
class Listed:
    """What a run reads besides its spec, as storage shows it now: listed once
    when a run is decided (:meth:`Pipeline.decide`), then handed to whatever
    needs it (the fingerprint, the manifest, the transforms bound to it).

    Attributes:
        inputs: The input listing (path, size, generation / mtime per file).
        files: SHA-256 of each file a transform's arguments name, by the name
            as written (:func:`transform_file_digests`).
        folders: The listing of each folder a transform reads files from, by
            its URI (:func:`transform_folder_listings`).
    """

    inputs: tuple[Any, ...]
    files: Mapping[str, str]
    folders: Mapping[str, tuple[Any, ...]]

    def parts(self, spec_fingerprint: str) -> dict[str, Any]:
        """The fingerprint's parts for a spec with this fingerprint."""
        return fingerprint_parts(spec_fingerprint, self.inputs, self.files, self.folders)


def folder_metadata(folders: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """The folder listings as stored in the manifest's metadata (``FOLDERS_KEY``)."""
    return {uri: {"files": len(listing),
                  "listing": _listing_doc(listing) if len(listing) <= MAX_STORED_FOLDER_FILES
                  else None}
            for uri, listing in sorted(folders.items())}


def _listing_doc(inputs: Sequence[Any]) -> list[list[Any]]:
    return sorted([str(i.uri), i.size, None if i.generation is None else str(i.generation)]
                  for i in inputs)


def listing_digest(inputs: Sequence[Any] | None) -> str | None:
    """SHA-256 of an input listing (its part of the fingerprint)."""
    return None if inputs is None else hashlib.sha256(
        json.dumps(_listing_doc(inputs)).encode()).hexdigest()


def fingerprint_parts(spec_fingerprint: str, inputs: Sequence[Any] | None,
                      files: Mapping[str, str],
                      folders: Mapping[str, Sequence[Any]] | None = None) -> dict[str, Any]:
    """The parts a run's fingerprint is made of (stored in the manifest's metadata).

    ``folders`` (folder URI -> listing) adds a ``folders`` part only when a
    transform reads a folder, so other pipelines' fingerprints do not depend on it.
    """
    parts: dict[str, Any] = {
        "spec": spec_fingerprint, "spec_form": SPEC_FORM, "inputs": listing_digest(inputs),
        "files": dict(sorted(files.items())), "format_version": OUTPUT_FORMAT_VERSION}
    if folders:
        parts["folders"] = {uri: listing_digest(listing)
                            for uri, listing in sorted(folders.items())}
    return parts


def written_form(old_parts: Any) -> bool:
    """Whether committed parts hold the spec as written (committed before
    ``spec_form``; also parts of a dataset committed before parts were stored)."""
    return not isinstance(old_parts, Mapping) or "spec_form" not in old_parts


def as_written_form(parts: Mapping[str, Any], written_spec: str) -> dict[str, Any]:
    """This run's parts as a slicefeed before ``spec_form`` computed them: the
    spec part is the digest of the spec as written, ``spec_form`` absent."""
    return {**{k: v for k, v in parts.items() if k != "spec_form"}, "spec": written_spec}


def same_but_listing(old_parts: Mapping[str, Any], parts: Mapping[str, Any]) -> bool:
    """Whether two runs' fingerprint parts agree except for the input listing."""
    return ({k: v for k, v in old_parts.items() if k != "inputs"}
            == {k: v for k, v in parts.items() if k != "inputs"})


def combine(parts: Mapping[str, Any]) -> str:
    """The run fingerprint: SHA-256 over its parts."""
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()


def describe_input_changes(old: Sequence[Any] | None, new: Sequence[Any]) -> str:
    """``"2 input files added, 1 changed, 1 removed"`` (listing vs listing)."""
    if old is None:
        return "the committed run recorded no input listing"
    before = {str(i.uri): (i.size, None if i.generation is None else str(i.generation))
              for i in old}
    after = {str(i.uri): (i.size, None if i.generation is None else str(i.generation))
             for i in new}
    return _count_changes(before, after, "input file") or "the input listing is the same"


def _count_changes(before: Mapping[str, Any], after: Mapping[str, Any], noun: str) -> str:
    """``"2 <noun>s added, 1 changed, 1 removed since the committed run (e.g. ...)"``,
    or ``""`` when the two listings agree."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(u for u in set(after) & set(before) if after[u] != before[u])
    parts = []
    for n, what in ((len(added), "added"), (len(changed), "changed"), (len(removed), "removed")):
        if n:
            parts.append(f"{n} {noun if n == 1 else noun + 's'} {what}"
                         if not parts else f"{n} {what}")
    if not parts:
        return ""
    example = (added or changed or removed)[0]
    return ", ".join(parts) + f" since the committed run (e.g. {_short(example)})"


def describe_folder_change(uri: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Why a folder a transform reads differs, from its two ``FOLDERS_KEY`` entries."""
    head = f"the files under {_short(uri)} (read by a transform) changed"
    old_list, new_list = old.get("listing"), new.get("listing")
    if isinstance(old_list, list) and isinstance(new_list, list):
        counted = _count_changes({str(e[0]): tuple(e[1:]) for e in old_list},
                                 {str(e[0]): tuple(e[1:]) for e in new_list}, "file")
        if counted:
            return f"{head}: {counted}"
    if isinstance(old.get("files"), int) and isinstance(new.get("files"), int):
        return f"{head} ({old['files']} files committed, {new['files']} now)"
    return head


def _short(uri: str, limit: int = 120) -> str:
    text = "".join(c if c.isprintable() else "?" for c in uri)
    return text if len(text) <= limit else "..." + text[-limit:]


def what_changed(old_parts: Mapping[str, Any] | None, new_parts: Mapping[str, Any],
                 old_inputs: Sequence[Any] | None, new_inputs: Sequence[Any],
                 old_folders: Mapping[str, Any] | None = None,
                 new_folders: Mapping[str, Any] | None = None) -> list[str]:
    """Human reasons why the committed run's fingerprint differs from this run's.

    ``old_folders``/``new_folders``: the ``FOLDERS_KEY`` metadata of each run.
    """
    if not old_parts:
        return [("the committed dataset was written before inputs were fingerprinted "
                 "(no input listing recorded)")]
    reasons = []
    if old_parts.get("spec") != new_parts["spec"]:
        reasons.append("the pipeline spec changed (sources, transforms, seed or on_error)")
    if old_parts.get("inputs") != new_parts["inputs"]:
        reasons.append(describe_input_changes(old_inputs, new_inputs))
    old_files, new_files = old_parts.get("files") or {}, new_parts["files"]
    for name in sorted(set(old_files) | set(new_files)):
        if old_files.get(name) != new_files.get(name):
            reasons.append(f"the content of {_short(name)} (read by a transform) changed")
    old_dirs, new_dirs = old_parts.get("folders") or {}, new_parts.get("folders") or {}
    for uri in sorted(set(old_dirs) | set(new_dirs)):
        if old_dirs.get(uri) != new_dirs.get(uri):
            if uri not in old_dirs:
                reasons.append(f"the files under {_short(uri)} (read by a transform) were not "
                               "part of the committed run's fingerprint")
            elif uri not in new_dirs:
                reasons.append(f"{_short(uri)} is no longer read by a transform")
            else:
                reasons.append(describe_folder_change(
                    uri, (old_folders or {}).get(uri) or {}, (new_folders or {}).get(uri) or {}))
    if old_parts.get("format_version") != new_parts["format_version"]:
        reasons.append(f"the output format version changed (committed: "
                       f"{old_parts.get('format_version')}, this slicefeed: "
                       f"{new_parts['format_version']})")
    return reasons or ["the fingerprint differs"]


def dated(uri: str) -> str:
    """``uri`` with a ``{date}`` folder (for the "how to proceed" hint)."""
    return uri if "{date}" in uri else uri.rstrip("/") + "/{date}"
