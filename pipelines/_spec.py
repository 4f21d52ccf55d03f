"""Pipeline specs: YAML in, validated (JSON Schema) and typed, before any Ray work.

:func:`load_spec` / :func:`validate_spec` return the validated plain dict;
:func:`parse_spec` returns it as a frozen :class:`PipelineSpec` (with
:class:`SourceSpec` / :class:`SinkSpec`), which is what a ``Pipeline`` reads.

A spec::

    name: text-demo                 # required
    seed: 0                         # randomness of seeded transforms
    source:                         # required (or `sources:`, a weighted mixture:
                                    #   [{name, format, uri, weight}, ...])
      format: jsonl                 # a registry format (parquet | jsonl | csv | text) or dataset
      uri: gs://bucket/raw/*.jsonl
      options: {columns: [text]}    # reader options
    transforms:                     # optional, applied in order
      - filter: {expr: "len > 3"}
      - cast: {columns: {len: int32}}
    sink:                           # required by `run` (not by `dataset()`)
      format: parquet
      uri: gs://bucket/out/text-demo
      options: {compression: zstd}
    on_error: fail                  # fail | skip | quarantine
    max_error_fraction: 0.0
    task_retries: 2                 # reruns of a task whose worker died, then fail
    placement:
      preprocess_on: any            # any | cpu_only (keep Ray Data off TPU hosts)

The structure is checked with JSON Schema (the ``jsonschema`` library);
errors are rewritten to name the key path, what was found and the allowed
values. Transform names and arguments are checked by
:func:`slicefeed.transforms.transform_from_spec`.

Hostile specs are refused before validation: YAML is loaded with a safe
loader that counts alias expansion (:data:`MAX_ALIAS_NODES`; a 600-byte
"billion laughs" spec would otherwise expand to gigabytes in messages and
fingerprints), every number must be finite (``.nan`` would switch
``max_error_fraction`` off), and a ``credentials`` value must be a path to
a key file, never the key itself (its value is never printed). Messages
quote user values with :func:`short_repr` (truncated, control characters
escaped). Values that would only fail inside Ray workers (option types,
seeds, codecs, duplicate source names) are checked here too.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import re
from collections.abc import Collection, Container, Mapping, Sequence
from typing import Any

import jsonschema
import yaml

from slicefeed.connectors import ON_ERROR_POLICIES, SpecError, printable, short_repr, type_name
from slicefeed.connectors._formats import FORMATS

#: The file formats of the registry, plus ``dataset`` (a committed slicefeed dataset).
SOURCE_FORMATS = (*FORMATS, "dataset")
SINK_FORMATS = ("parquet",)

# Reader options each source format accepts (keyword arguments of the readers).
SOURCE_OPTIONS = {
    **{name: f.spec_options for name, f in FORMATS.items()},
    "dataset": ("columns",),
}
SINK_OPTIONS = ("compression", "min_rows_per_file", "row_group_size", "row_group_bytes")
STORAGE_OPTIONS = ("credentials", "anonymous", "project")
#: Parquet codecs pyarrow writes (``sink.options.compression``, any case).
COMPRESSIONS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
#: Seeds are stored in manifests and hashed per row as 64-bit integers.
MAX_SEED = 2**63 - 1
#: Nodes that YAML aliases may add to a spec in all (a plain spec uses a few).
MAX_ALIAS_NODES = 10_000
#: Default and largest ``task_retries``: how often Ray may rerun a task whose
#: worker died (Ray Data's own default is unbounded, so a record that kills
#: its worker every time would make a run loop forever).
DEFAULT_TASK_RETRIES = 2
MAX_TASK_RETRIES = 100

_INT = {"type": "integer"}
_SEED = {"type": "integer", "minimum": 0, "maximum": MAX_SEED}
# Types of reader and writer options: checked here, not in a Ray worker.
_OPTION_TYPES = {
    "columns": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    "shuffle_seed": _SEED,
    "delimiter": {"type": "string", "minLength": 1, "maxLength": 1},
    "drop_empty_lines": {"type": "boolean"},
}
_SINK_OPTION_TYPES = {
    "compression": {"enum": list(COMPRESSIONS)},
    "min_rows_per_file": {"type": "integer", "minimum": 1},
    "row_group_size": {"type": "integer", "minimum": 1},
    "row_group_bytes": {"type": "integer", "minimum": 1},
}

#: The largest mixture weight. Weights are relative, so no mixture needs more
#: range; the cap keeps their sum (which normalises them) finite for any number
#: of sources, where weights near float64's maximum overflowed it.
MAX_WEIGHT = 1e12

_STORAGE = {
    "credentials": {"type": "string"},
    "anonymous": {"type": "boolean"},
    "project": {"type": "string"},
}

_SOURCE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["format", "uri"],
    "properties": {
        "format": {"enum": list(SOURCE_FORMATS)},
        "uri": {"type": "string", "minLength": 1},
        "options": {"type": "object", "properties": _OPTION_TYPES},
        "weight": {"type": "number", "exclusiveMinimum": 0},
        "name": {"type": "string", "minLength": 1},
        "storage": {"type": "object", "additionalProperties": False, "properties": _STORAGE},
    },
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "seed": _SEED,
        "source": _SOURCE,
        "sources": {"type": "array", "minItems": 1, "items": _SOURCE},
        "transforms": {
            "type": "array",
            "items": {"anyOf": [{"type": "string"}, {"type": "object", "minProperties": 1, "maxProperties": 1}]},
        },
        "sink": {
            "type": "object",
            "additionalProperties": False,
            "required": ["format", "uri"],
            "properties": {
                "format": {"enum": list(SINK_FORMATS)},
                "uri": {"type": "string", "minLength": 1},
                "options": {"type": "object", "properties": _SINK_OPTION_TYPES},
                "storage": {"type": "object", "additionalProperties": False, "properties": _STORAGE},
            },
        },
        "on_error": {"enum": list(ON_ERROR_POLICIES)},
        "max_error_fraction": {"type": "number", "minimum": 0, "maximum": 1},
        "task_retries": {"type": "integer", "minimum": 0, "maximum": MAX_TASK_RETRIES},
        "placement": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"preprocess_on": {"enum": ["cpu_only", "any"]}},
        },
    },
}


def _cap(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class _BudgetLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts the nodes aliases add, and refuses recursion.

    PyYAML shares an aliased node rather than copying it, so the expansion
    only happens later (JSON Schema, ``json.dumps`` for the fingerprint,
    messages); the count is what that expansion would cost.
    """

    def __init__(self, stream: str, *, source: str):
        super().__init__(stream)
        self._source = source
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}
        self._open: set[str] = set()

    def _refuse(self, what: str, event: Any) -> SpecError:
        mark = getattr(event, "start_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return SpecError(f"{self._source}: {what}{where}; refusing the spec. Write the values "
                         "out, or use fewer aliases.")

    def _size(self, node: yaml.Node) -> int:
        key = id(node)
        if key not in self._sizes:
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            total = 1
            for c in children:
                total += self._size(c)
                if total > MAX_ALIAS_NODES:
                    break
            self._sizes[key] = total
        return self._sizes[key]

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # A key written twice in one mapping: YAML says keys are unique, and
        # PyYAML would silently keep the last value. Keys that a merge (<<)
        # brings in may be overridden, as YAML intends.
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader refuses it itself
                    continue
                if duplicate:
                    raise SpecError(
                        f"{self._source}: key {short_repr(key, 60)} appears twice in one mapping "
                        f"(line {key_node.start_mark.line + 1}); keep one (YAML would silently "
                        "use the last).")
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if self.check_event(yaml.AliasEvent):
            if anchor in self._open:
                raise self._refuse(f"recursive YAML alias *{short_repr(anchor, 40)}", event)
            target = self.anchors.get(anchor)
            if target is not None:
                self._alias_nodes += self._size(target)
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise self._refuse(f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes", event)
            return super().compose_node(parent, index)
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open.discard(anchor)


# Scalars are read as YAML 1.2's core schema reads them, not as YAML 1.1
# (PyYAML's): only true/false (any case form YAML names) are booleans, so
# `country: NO` is the text NO; no base-60 numbers (`12:30` is text); no
# leading-zero octal (`010` is text; `0o10` is 8); `1e3` is a number. As
# PyYAML did, `_` may group digits (`1_000`). YAML timestamps stay: a
# fill value may be one (see `fill_null`).
_YAML_1_1_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
_BudgetLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_1_1_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BudgetLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_BudgetLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0o[0-7_]+|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
_BudgetLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*\.[0-9_]*)(?:[eE][-+]?[0-9]+)?
                   |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.VERBOSE),
    list("-+0123456789."))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    # Python's own literal rules: 0x and 0o prefixes, `_` between digits.
    return int(loader.construct_scalar(node).replace("_", ""), 0)


_BudgetLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def safe_load_yaml(text: str, *, source: str = "pipeline spec") -> Any:
    """``yaml.safe_load`` with an alias-expansion budget (:data:`MAX_ALIAS_NODES`).

    Raises:
        SpecError: the aliases would expand beyond the budget, or refer to
            the node they are in, or the document nests too deeply.
        yaml.YAMLError: the text is not valid YAML.
    """
    loader = _BudgetLoader(text, source=source)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise SpecError(f"{source}: the YAML nests too deeply; refusing the spec.") from None
    finally:
        loader.dispose()


def _where(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


_JSON_TYPES = {"integer": "an integer", "number": "a number", "string": "a string",
               "array": "a list", "object": "a mapping", "boolean": "a boolean"}


def _message(err: jsonschema.ValidationError, source: str) -> str:
    where = _where(err.absolute_path)
    v = err.validator
    if "credentials" in err.absolute_path:
        return _credentials_message(source, where)
    shown = short_repr(err.instance)
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return (f"{source}: unknown key {short_repr(extra[0])} in {where}; allowed keys: "
                f"{', '.join(allowed)}.")
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        hint = " (a `source:` with format and uri is required)" if missing == "source" else ""
        return f"{source}: missing required key {missing!r} in {where}{hint}."
    if v == "enum":
        return (f"{source}: {where} is {shown}; allowed values: "
                f"{', '.join(map(str, err.validator_value))}.")
    if v == "type":
        return (f"{source}: {where} must be {_JSON_TYPES.get(err.validator_value, err.validator_value)}, "
                f"got {type_name(err.instance)} {shown}.")
    if v in ("anyOf", "minProperties", "maxProperties") and where.startswith("transforms"):
        return (f"{source}: {where} must be a mapping with exactly one key, the transform "
                f"name, e.g. {{select: {{columns: [a]}}}}; got {shown}.")
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if v in bounds:
        return f"{source}: {where} must be {bounds[v]} {err.validator_value}, got {shown}."
    if v in ("minLength", "maxLength", "minItems", "maxItems"):
        what = "characters" if "Length" in v else "items"
        side = "at least" if v.startswith("min") else "at most"
        return f"{source}: {where} must have {side} {err.validator_value} {what}, got {shown}."
    # jsonschema's own text quotes the whole value: never shown.
    return f"{source}: {where} is invalid ({v}: {short_repr(err.validator_value)}), got {shown}."


def _credentials_message(source: str, where: str) -> str:
    # The value may be the key itself: it is never printed.
    return (f"{source}: {where} must be a path to a key file (the value given is not shown). "
            "Save the service-account key as a file and give its path, or leave credentials "
            "unset to use application-default credentials.")


def _storages(spec: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out = []
    if isinstance(spec.get("source"), Mapping):
        out.append(("source.storage", spec["source"].get("storage")))
    if isinstance(spec.get("sources"), list):
        out += [(f"sources.{i}.storage", s.get("storage")) for i, s in enumerate(spec["sources"])
                if isinstance(s, Mapping)]
    if isinstance(spec.get("sink"), Mapping):
        out.append(("sink.storage", spec["sink"].get("storage")))
    return [(w, s) for w, s in out if isinstance(s, Mapping)]


def _is_key_path(value: Any) -> bool:
    return (isinstance(value, (str, os.PathLike)) and 0 < len(os.fspath(value)) <= 4096
            and os.fspath(value).isprintable() and not os.fspath(value).lstrip().startswith("{"))


def _check_hostile(spec: Mapping[str, Any], source: str) -> None:
    """Refuses inline credentials and non-finite numbers, before anything quotes them."""
    for where, storage in _storages(spec):
        cred = storage.get("credentials")
        if cred is not None and not _is_key_path(cred):
            raise SpecError(_credentials_message(source, f"{where}.credentials"))
    stack: list[tuple[tuple[Any, ...], Any]] = [((), spec)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise SpecError(f"{source}: {_where(path)} is not a finite number ({node}); "
                            "use a finite value.")
        if isinstance(node, Mapping):
            stack += [((*path, k), v) for k, v in reversed(list(node.items()))]
        elif isinstance(node, (list, tuple)):
            stack += [((*path, i), v) for i, v in reversed(list(enumerate(node)))]


def validate_spec(spec: Any, *, source: str = "pipeline spec") -> dict[str, Any]:
    """Validates a spec dict; returns a normalised deep copy.

    Checks structure (JSON Schema), the source/sink options for each format,
    and that every transform exists with valid arguments.

    Raises:
        SpecError: naming the offending key and the allowed values.
    """
    if not isinstance(spec, Mapping):
        raise SpecError(f"{source}: a pipeline spec must be a mapping with keys name, source, "
                        f"transforms, sink; got {type_name(spec)}.")
    _check_hostile(spec, source)
    spec = copy.deepcopy(dict(spec))
    opts = (spec.get("sink") or {}).get("options") if isinstance(spec.get("sink"), Mapping) else None
    if isinstance(opts, Mapping) and isinstance(opts.get("compression"), str):
        spec["sink"] = dict(spec["sink"], options=dict(opts, compression=opts["compression"].lower()))
    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(spec), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        raise SpecError(_message(errors[0], source))
    if "source" in spec and "sources" in spec:
        raise SpecError(f"{source}: give either `source` or `sources` (a mixture), not both.")
    if "source" not in spec and "sources" not in spec:
        raise SpecError(f"{source}: missing required key 'source' (a mapping with format and uri).")
    srcs = [("source", spec["source"])] if "source" in spec else [
        (f"sources.{i}", s) for i, s in enumerate(spec["sources"])]
    for where, src in srcs:
        allowed = SOURCE_OPTIONS[src["format"]]
        for key in src.get("options", {}) or {}:
            if key not in allowed:
                raise SpecError(f"{source}: unknown option {short_repr(key)} in {where}.options for format "
                                f"{src['format']!r}; allowed options: {', '.join(allowed)}.")
    for key in (spec.get("sink", {}).get("options") or {}):
        if key not in SINK_OPTIONS:
            raise SpecError(f"{source}: unknown option {short_repr(key)} in sink.options; allowed options: "
                            f"{', '.join(SINK_OPTIONS)}.")
    if "sources" in spec:
        seen: dict[str, int] = {}
        for i, src in enumerate(spec["sources"]):
            # The mixture names an unnamed source by its position.
            name = str(src.get("name", i))
            if name in seen:
                raise SpecError(f"{source}: sources.{i}.name {short_repr(name)} is used by "
                                f"sources.{seen[name]}; give each source a distinct name.")
            seen[name] = i
        for i, src in enumerate(spec["sources"]):
            # Weights are relative; the cap keeps their sum (which normalises
            # them) finite, so the mixture's shares are numbers, not NaN.
            w = src.get("weight", 1.0)
            if not w <= MAX_WEIGHT:
                raise SpecError(f"{source}: sources.{i}.weight is {short_repr(w)}; a mixture weight "
                                f"must be at most {MAX_WEIGHT:g} (weights are relative: scale them "
                                "down together).")
    for where, storage in _storages(spec):
        if storage.get("credentials") is not None and storage.get("anonymous"):
            raise SpecError(f"{source}: {where}: give either credentials (a key file) or "
                            "anonymous: true, not both.")
    spec.setdefault("seed", 0)
    spec.setdefault("transforms", [])
    spec.setdefault("on_error", "fail")
    spec.setdefault("max_error_fraction", 0.0)
    spec.setdefault("task_retries", DEFAULT_TASK_RETRIES)
    from slicefeed.transforms import transform_from_spec

    for i, item in enumerate(spec["transforms"]):
        try:
            transform_from_spec(item)
        except SpecError as e:
            raise SpecError(f"{source}: transforms.{i}: {_cap(str(e))}") from None
    return spec


# -- typed specs ----------------------------------------------------------------


def _copy(d: Mapping[str, Any] | None) -> dict[str, Any]:
    # A private deep copy: the typed spec never aliases the caller's dict.
    return copy.deepcopy(dict(d or {}))


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One source: a registry file format (or ``dataset``) at ``uri``.

    Attributes:
        format: ``parquet``, ``jsonl``, ``csv``, ``text`` or ``dataset``.
        uri: Where the data is (local path, ``gs://``, a glob).
        options: Reader options (validated against the format's allowed keys).
        storage: ``credentials`` / ``anonymous`` / ``project`` for the filesystem.
        name: The source's name in a mixture (default: its index).
        weight: Its mixture weight (default 1).
    """

    format: str
    uri: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    storage: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str | None = None
    weight: float = 1.0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SourceSpec:
        return cls(
            format=d["format"], uri=d["uri"], options=_copy(d.get("options")),
            storage=_copy({k: v for k, v in (d.get("storage") or {}).items() if k in STORAGE_OPTIONS}),
            name=d.get("name"), weight=float(d.get("weight", 1.0)),
        )


@dataclasses.dataclass(frozen=True)
class SinkSpec:
    """Where ``run`` commits its output: a Parquet dataset at ``uri``."""

    format: str
    uri: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    storage: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SinkSpec:
        return cls(
            format=d["format"], uri=d["uri"], options=_copy(d.get("options")),
            storage=_copy({k: v for k, v in (d.get("storage") or {}).items() if k in STORAGE_OPTIONS}),
        )


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline spec, typed; built once by :func:`parse_spec`.

    Attributes:
        name: Pipeline name.
        seed: Seed of every random transform and of mixtures.
        sources: One source, or the sources of a weighted mixture.
        is_mixture: Whether the spec gave ``sources:`` (a mixture).
        transforms: The transform items as written (``{name: {arg: value}}``).
        sink: Where ``run`` commits; None for a spec used only for ``dataset()``.
        on_error: One of :data:`ON_ERROR_POLICIES`.
        max_error_fraction: Bad rows allowed, as a fraction of rows read.
        preprocess_on: Placement of Ray Data's work (``cpu_only``/``any``) or None.
        task_retries: Reruns of a task whose worker died.
        fingerprint: SHA-256 of what determines the output (see :func:`fingerprint`).
        written_fingerprint: The fingerprint of the spec as written, as slicefeed
            computed it before specs were normalised (see :func:`written_fingerprint`).
    """

    name: str
    seed: int
    sources: tuple[SourceSpec, ...]
    is_mixture: bool
    transforms: tuple[Any, ...]
    sink: SinkSpec | None
    on_error: str
    max_error_fraction: float
    preprocess_on: str | None
    fingerprint: str
    #: Reruns of a task whose worker died (Ray's ``max_retries``).
    task_retries: int = 2
    description: str = ""
    written_fingerprint: str = ""
    #: The validated dict it was built from (what :func:`validate_spec` returns).
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    # Read access by key, for code written against the validated dict
    # (``spec["sink"]["uri"]``); slicefeed itself reads the attributes.
    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> PipelineSpec:
        """From a dict that :func:`validate_spec` returned."""
        mixture = "sources" in spec
        raw_sources = spec["sources"] if mixture else [spec["source"]]
        return cls(
            name=spec["name"],
            seed=int(spec["seed"]),
            sources=tuple(SourceSpec.from_dict(s) for s in raw_sources),
            is_mixture=mixture,
            transforms=tuple(copy.deepcopy(spec["transforms"])),
            sink=SinkSpec.from_dict(spec["sink"]) if "sink" in spec else None,
            on_error=spec["on_error"],
            max_error_fraction=float(spec["max_error_fraction"]),
            preprocess_on=(spec.get("placement") or {}).get("preprocess_on"),
            fingerprint=fingerprint(spec),
            written_fingerprint=written_fingerprint(spec),
            task_retries=int(spec.get("task_retries", 2)),
            description=spec.get("description", ""),
            raw=copy.deepcopy(dict(spec)),
        )

    @property
    def source_names(self) -> list[str]:
        """Each source's name in a mixture (its index when unnamed)."""
        return [s.name if s.name is not None else str(i) for i, s in enumerate(self.sources)]


def parse_spec(spec: Any, *, source: str = "pipeline spec") -> PipelineSpec:
    """Validates a spec dict (as :func:`validate_spec`) and returns it typed.

    Raises:
        SpecError: naming the offending key and the allowed values.
    """
    return PipelineSpec.from_dict(validate_spec(spec, source=source))


def apply_overrides(spec: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """Applies ``key.path=value`` overrides (values parsed as YAML scalars/lists).

    ``transforms.0.filter.expr="x > 1"`` indexes lists by position. Mappings
    on the way are created when missing.

    Raises:
        SpecError: for a malformed override or a path through a non-container.
    """
    if not overrides:
        return spec
    spec = copy.deepcopy(spec)
    items = overrides.items() if isinstance(overrides, Mapping) else [_split_override(o) for o in overrides]
    for key, value in items:
        parts = key.split(".")
        node: Any = spec
        for depth, part in enumerate(parts[:-1]):
            node = _step(node, part, key, depth, create=True)
        last = parts[-1]
        if isinstance(node, list):
            node[_index(node, last, key)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise SpecError(f"--set {printable(key, 200)}: {printable('.'.join(parts[:-1]), 200)} is a {type_name(node)}, not a mapping or list.")
    return spec


def _split_override(text: str) -> tuple[str, Any]:
    if "=" not in text or text.startswith("="):
        raise SpecError(f"--set {short_repr(text)}: expected key.path=value, e.g. --set sink.uri=/tmp/out")
    key, raw = text.split("=", 1)
    try:
        value = safe_load_yaml(raw, source=f"--set {printable(key.strip(), 200)}") if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _index(node: list, part: str, key: str) -> int:
    try:
        i = int(part)
    except ValueError:
        raise SpecError(f"--set {printable(key, 200)}: {short_repr(part)} indexes a list; use a number (0..{len(node) - 1}).") from None
    if not -len(node) <= i < len(node):
        raise SpecError(f"--set {printable(key, 200)}: index {i} is out of range; the list has {len(node)} items.")
    return i


def _step(node: Any, part: str, key: str, depth: int, *, create: bool) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            if not create:
                raise SpecError(f"--set {printable(key, 200)}: no key {short_repr(part)}")
            node[part] = {}
        return node[part]
    raise SpecError(f"--set {printable(key, 200)}: {printable('.'.join(key.split('.')[:depth]), 200)} is a {type_name(node)}, not a mapping or list.")


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Reads a YAML spec file (safely), applies overrides and validates it."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SpecError(f"pipeline spec {path!r} does not exist.") from None
    try:
        spec = safe_load_yaml(text, source=path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where} ({getattr(e, 'problem', e)}).") from None
    if isinstance(spec, Mapping):
        spec = apply_overrides(dict(spec), overrides)
    return validate_spec(spec, source=path)


def _names_fixed_by(fmt: Any, uri: str) -> bool:
    """Whether every file ``uri`` names has a name ending in one of ``fmt``'s suffixes
    known from the URI: a file or glob whose last part ends with such a suffix
    (``a.tsv``, ``raw/*.csv``). A folder's files are named each their own way."""
    return fmt.claims(uri.rsplit("/", 1)[-1])


def _source_options(src: Mapping[str, Any], *, folders: Container[str]) -> dict[str, Any]:
    """The reader options of ``src`` as the fingerprint writes them: ``columns``,
    ``shuffle_seed`` and the format's ``fingerprinted_defaults`` always, with
    their defaults filled in (what the reader uses); any other option only
    where given and not at its default (so adding an option to a format
    changes no fingerprint).

    An option whose default depends on each file's name (CSV's ``delimiter``:
    tab for ``.tsv``) is filled in only where the URI fixes the names (see
    :func:`_names_fixed_by`; not for a URI in ``folders``); elsewhere it stays
    as given, or None for "by each file's name", so ``delimiter: ","`` over a
    folder, which also reads its ``.tsv`` files with commas, is another spec.
    """
    from slicefeed.connectors._fs import canonical_uri

    given = {k: v for k, v in (src.get("options") or {}).items() if v is not None}
    fmt = FORMATS.get(src["format"])
    if fmt is None:  # a committed dataset
        return {k: given.get(k) for k in ("columns", "shuffle_seed")}
    always = {k for k in fmt.spec_options if k not in fmt.options or k in fmt.fingerprinted_defaults}
    out: dict[str, Any] = {k: given.get(k) for k in fmt.spec_options if k in always}
    by_name = {k for opts in fmt.suffix_options.values() for k in opts}
    uri = canonical_uri(src["uri"])
    fixed = _names_fixed_by(fmt, uri) and uri not in folders
    for key, default in fmt.options.items():
        if key not in always:
            # Over a folder a name-dependent option given at its default still
            # decides something (every file's reading); elsewhere it does not.
            at_default = _same_value(given.get(key), fmt.options_for(uri.rsplit("/", 1)[-1])[key]
                                     if fixed else default)
            if key in given and (not at_default or (key in by_name and not fixed)):
                out[key] = given[key]
        elif key in given:
            continue
        elif key not in by_name:
            out[key] = default
        elif fixed:
            out[key] = fmt.options_for(uri.rsplit("/", 1)[-1])[key]
    return out


def _same_value(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one value of one YAML type (``True`` is not ``1``)."""
    from slicefeed.transforms._registry import json_form

    return json.dumps(json_form(a), sort_keys=True) == json.dumps(json_form(b), sort_keys=True)


def canonical_spec(spec: Mapping[str, Any], *, folders: Container[str] = ()) -> dict[str, Any]:
    """What a validated spec means for the rows it computes: the document its
    fingerprint hashes.

    Sources by their canonical URI (:func:`~slicefeed.connectors._fs.canonical_uri`:
    ``gs://b/raw/`` is ``gs://b/raw``, a local path is absolute and normalised),
    format and reader options (see :func:`_source_options`);
    in a mixture also each source's name (its index when unnamed) and weight
    (a number), which decide its rows; a lone source's name and weight decide
    nothing and are left out. Each transform as it runs
    (:meth:`~slicefeed.transforms.Transform.fingerprint_spec` of the transform
    seeded with the pipeline seed: the arguments that differ from their defaults, typed;
    ``filter`` by its parsed expression). Then the seed and the bad-record
    policy. Left out, as they decide no value: the sink, storage options,
    name, description, placement and task retries.

    ``folders``: canonical URIs of sources known to be folders (listed), whose
    files' names, not the URI's, decide name-dependent options.
    """
    from slicefeed.connectors._fs import canonical_uri
    from slicefeed.transforms import transform_from_spec

    mixture = "sources" in spec
    seed = int(spec.get("seed", 0))
    sources = []
    for i, src in enumerate(spec["sources"] if mixture else [spec["source"]]):
        doc: dict[str, Any] = {"format": src["format"], "uri": canonical_uri(src["uri"]),
                               "options": _source_options(src, folders=folders)}
        if mixture:
            doc.update(name=str(src.get("name", i)), weight=float(src.get("weight", 1.0)))
        sources.append(doc)
    return {
        "sources": sources,
        "transforms": [transform_from_spec(item).with_seed(seed).fingerprint_spec()
                       for item in spec.get("transforms") or []],
        "seed": seed,
        "on_error": spec.get("on_error", "fail"),
        "max_error_fraction": float(spec.get("max_error_fraction", 0.0)),
    }


def fingerprint(spec: Mapping[str, Any], *, folders: Container[str] = ()) -> str:
    """SHA-256 of what determines the output: the spec's :func:`canonical_spec`,
    as JSON that keeps YAML's types apart
    (:func:`~slicefeed.transforms._registry.json_form`).

    Two specs that mean the same (a trailing slash, spaces in an expression, a
    default written out) have one fingerprint; any difference that can change
    a written value gives another. The sink and storage credentials are left
    out, so the same pipeline written to another place has the same fingerprint.
    """
    from slicefeed.transforms._registry import json_form

    # A YAML timestamp is not the string that prints it (fill_null writes them
    # differently), nor is a key 1 the key "1".
    doc = json_form(canonical_spec(spec, folders=folders))
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _path_key(uri: str) -> str:
    """``uri`` without its protocol and outer ``/``: the listing writes some
    protocols' paths with a leading ``/`` (``memory:///a``) that the spec's
    URI may not have (``memory://a``)."""
    return uri.split("://", 1)[-1].strip("/")


def listed_fingerprint(spec: PipelineSpec, listed: Collection[str]) -> str:
    """``spec.fingerprint``, checked against the input listing (``listed``: the
    listed files' URIs): a source URI named like a file of its format's suffix
    (``in/a.csv``) that is not listed as a file is a folder so named, whose
    files' own names decide their name-dependent options (a ``.tsv`` inside is
    read with tabs), so they are not filled in from the URI's name. A URI with
    glob characters is such a folder when listed files lie under it (a path
    that exists is read as written, not as a glob: ``in/[x].tsv`` may be a
    folder holding ``a.csv``); else it is a glob, whose matches are files
    named like it."""
    from slicefeed.connectors._fs import canonical_uri, has_glob

    folders = set()
    for src in spec.sources:
        fmt = FORMATS.get(src.format)
        uri = canonical_uri(src.uri)
        if (fmt is None or not fmt.suffix_options or not _names_fixed_by(fmt, uri)
                or uri in listed):
            continue
        if has_glob(uri):
            base = _path_key(uri) + "/"
            if not any(_path_key(f).startswith(base) for f in listed):
                continue
        folders.add(uri)
    return fingerprint(spec.raw, folders=folders) if folders else spec.fingerprint


def written_fingerprint(spec: Mapping[str, Any]) -> str:
    """The spec fingerprint of slicefeed before specs were normalised: SHA-256 of
    the sources (less storage), transforms, seed and policy as written.

    Only to recognise a dataset such a slicefeed committed (its fingerprint
    parts have no ``spec_form``; see :mod:`slicefeed.pipelines._rerun`).
    Returns ``""`` (which no digest equals) for a spec holding a value JSON has
    no type for (a YAML date or timestamp, bytes, a set) or a mapping key that
    is not a string: that digest wrote them as text, so it cannot tell
    ``2024-01-01 10:00:00`` from ``"2024-01-01 10:00:00"``, which can write
    other values.
    """
    def strip(src: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in src.items() if k != "storage"}

    doc = {
        "sources": [strip(s) for s in ([spec["source"]] if "source" in spec else spec["sources"])],
        "transforms": spec.get("transforms", []),
        "seed": spec.get("seed", 0),
        "on_error": spec.get("on_error", "fail"),
        "max_error_fraction": spec.get("max_error_fraction", 0.0),
    }
    if not _plain_json(doc):
        return ""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _plain_json(value: Any) -> bool:
    """Whether ``value`` holds only JSON's types (string keys)."""
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    return value is None or isinstance(value, (str, int, float))


# ``{date}``, ``{datetime}``, ``{env:NAME}`` in source and sink URIs.
_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")


def expand_uri_templates(
    spec: Mapping[str, Any],
    *,
    when: _dt.datetime | _dt.date | str | None = None,
    env: Mapping[str, str] | None = None,
    source: str = "pipeline spec",
) -> dict[str, Any]:
    """Fills ``{date}``, ``{datetime}`` and ``{env:NAME}`` in source and sink URIs.

    ``{date}`` is the run's UTC date (``2026-11-30``), ``{datetime}`` its UTC
    time (``20261130T031500Z``); ``when`` fixes them (a date, a datetime, or
    ``YYYY-MM-DD``), default now. ``{env:NAME}`` is the environment variable
    NAME. A scheduled job writes one committed dataset per run with
    ``sink.uri: gs://bucket/out/{date}``.

    Raises:
        SpecError: an unknown placeholder, an unset variable, or a bad ``when``.
    """
    env = os.environ if env is None else env
    now = parse_run_date(when)
    values = {"date": now.strftime("%Y-%m-%d"), "datetime": now.strftime("%Y%m%dT%H%M%SZ")}

    def fill(uri: str, where: str) -> str:
        def one(m: re.Match[str]) -> str:
            name, arg = m.group(1), m.group(2)
            if name == "env" and arg is not None:
                if arg not in env:
                    raise SpecError(f"{source}: {where} uses {{env:{arg}}} but the environment "
                                    f"variable {arg} is not set.")
                return env[arg]
            if arg is None and name in values:
                return values[name]
            raise SpecError(f"{source}: {where} has an unknown placeholder {m.group(0)[:60]!r}; "
                            "allowed: {date}, {datetime}, {env:NAME}.")
        return _TEMPLATE.sub(one, uri)

    out = copy.deepcopy(dict(spec))
    if isinstance(out.get("source"), dict) and isinstance(out["source"].get("uri"), str):
        out["source"]["uri"] = fill(out["source"]["uri"], "source.uri")
    for i, src in enumerate(out.get("sources") or []):
        if isinstance(src, dict) and isinstance(src.get("uri"), str):
            src["uri"] = fill(src["uri"], f"sources.{i}.uri")
    if isinstance(out.get("sink"), dict) and isinstance(out["sink"].get("uri"), str):
        out["sink"]["uri"] = fill(out["sink"]["uri"], "sink.uri")
    return out


def parse_run_date(when: _dt.datetime | _dt.date | str | None) -> _dt.datetime:
    """The run's UTC time: now, or ``when`` (``YYYY-MM-DD`` or a date/datetime).

    Raises:
        SpecError: ``when`` is not a ``YYYY-MM-DD`` date.
    """
    if when is None:
        return _dt.datetime.now(_dt.UTC)
    if isinstance(when, _dt.datetime):
        return when.astimezone(_dt.UTC) if when.tzinfo else when.replace(
            tzinfo=_dt.UTC)
    if isinstance(when, _dt.date):
        return _dt.datetime(when.year, when.month, when.day, tzinfo=_dt.UTC)
    try:
        d = _dt.date.fromisoformat(str(when))
        if len(str(when)) != 10:
            raise ValueError
    except ValueError:
        raise SpecError(f"--date {str(when)[:40]!r}: expected YYYY-MM-DD, e.g. 2026-11-30.") from None
    return _dt.datetime(d.year, d.month, d.day, tzinfo=_dt.UTC)
