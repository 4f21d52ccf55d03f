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
    placement:
      preprocess_on: any            # any | cpu_only (keep Ray Data off TPU hosts)

The structure is checked with JSON Schema (the ``jsonschema`` library);
errors are rewritten to name the key path, what was found and the allowed
values. Transform names and arguments are checked by
:func:`slicefeed.transforms.transform_from_spec`. YAML is only ever loaded
with ``yaml.safe_load``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
import yaml

from slicefeed.connectors import ON_ERROR_POLICIES, SpecError
from slicefeed.connectors._formats import FORMATS

#: The file formats of the registry, plus ``dataset`` (a committed slicefeed dataset).
SOURCE_FORMATS = (*FORMATS, "dataset")
SINK_FORMATS = ("parquet",)

# Reader options each source format accepts (keyword arguments of the readers).
SOURCE_OPTIONS = {
    **{name: f.spec_options for name, f in FORMATS.items()},
    "dataset": ("columns",),
}
SINK_OPTIONS = ("compression", "min_rows_per_file", "row_group_size")
STORAGE_OPTIONS = ("credentials", "anonymous", "project")

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
        "options": {"type": "object"},
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
        "seed": {"type": "integer"},
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
                "options": {"type": "object"},
                "storage": {"type": "object", "additionalProperties": False, "properties": _STORAGE},
            },
        },
        "on_error": {"enum": list(ON_ERROR_POLICIES)},
        "max_error_fraction": {"type": "number", "minimum": 0, "maximum": 1},
        "placement": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"preprocess_on": {"enum": ["cpu_only", "any"]}},
        },
    },
}


def _where(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


_JSON_TYPES = {"integer": "an integer", "number": "a number", "string": "a string",
               "array": "a list", "object": "a mapping", "boolean": "a boolean"}


def _message(err: jsonschema.ValidationError, source: str) -> str:
    where = _where(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return (f"{source}: unknown key {extra[0]!r} in {where}; allowed keys: "
                f"{', '.join(allowed)}.")
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        hint = " (a `source:` with format and uri is required)" if missing == "source" else ""
        return f"{source}: missing required key {missing!r} in {where}{hint}."
    if v == "enum":
        return (f"{source}: {where} is {err.instance!r}; allowed values: "
                f"{', '.join(map(str, err.validator_value))}.")
    if v == "type":
        return (f"{source}: {where} must be {_JSON_TYPES.get(err.validator_value, err.validator_value)}, "
                f"got {_type_name(err.instance)} {err.instance!r}.")
    if v in ("anyOf", "minProperties", "maxProperties") and where.startswith("transforms"):
        return (f"{source}: {where} must be a mapping with exactly one key, the transform "
                f"name, e.g. {{select: {{columns: [a]}}}}; got {err.instance!r}.")
    return f"{source}: {where}: {err.message}."


def validate_spec(spec: Any, *, source: str = "pipeline spec") -> dict[str, Any]:
    """Validates a spec dict; returns a normalised deep copy.

    Checks structure (JSON Schema), the source/sink options for each format,
    and that every transform exists with valid arguments.

    Raises:
        SpecError: naming the offending key and the allowed values.
    """
    if not isinstance(spec, Mapping):
        raise SpecError(f"{source}: a pipeline spec must be a mapping with keys name, source, "
                        f"transforms, sink; got {_type_name(spec)}.")
    spec = copy.deepcopy(dict(spec))
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
                raise SpecError(f"{source}: unknown option {key!r} in {where}.options for format "
                                f"{src['format']!r}; allowed options: {', '.join(allowed)}.")
    for key in (spec.get("sink", {}).get("options") or {}):
        if key not in SINK_OPTIONS:
            raise SpecError(f"{source}: unknown option {key!r} in sink.options; allowed options: "
                            f"{', '.join(SINK_OPTIONS)}.")
    spec.setdefault("seed", 0)
    spec.setdefault("transforms", [])
    spec.setdefault("on_error", "fail")
    spec.setdefault("max_error_fraction", 0.0)
    from slicefeed.transforms import transform_from_spec

    for i, item in enumerate(spec["transforms"]):
        try:
            transform_from_spec(item)
        except SpecError as e:
            raise SpecError(f"{source}: transforms.{i}: {e}") from None
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
        fingerprint: SHA-256 of what determines the output (see :func:`fingerprint`).
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
    description: str = ""
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
            raise SpecError(f"--set {key}: {'.'.join(parts[:-1])} is a {_type_name(node)}, not a mapping or list.")
    return spec


def _split_override(text: str) -> tuple[str, Any]:
    if "=" not in text or text.startswith("="):
        raise SpecError(f"--set {text!r}: expected key.path=value, e.g. --set sink.uri=/tmp/out")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _index(node: list, part: str, key: str) -> int:
    try:
        i = int(part)
    except ValueError:
        raise SpecError(f"--set {key}: {part!r} indexes a list; use a number (0..{len(node) - 1}).") from None
    if not -len(node) <= i < len(node):
        raise SpecError(f"--set {key}: index {i} is out of range; the list has {len(node)} items.")
    return i


def _step(node: Any, part: str, key: str, depth: int, *, create: bool) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            if not create:
                raise SpecError(f"--set {key}: no key {part!r}")
            node[part] = {}
        return node[part]
    raise SpecError(f"--set {key}: {'.'.join(key.split('.')[:depth])} is a {_type_name(node)}, not a mapping or list.")


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Reads a YAML spec file (safely), applies overrides and validates it."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SpecError(f"pipeline spec {path!r} does not exist.") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where} ({getattr(e, 'problem', e)}).") from None
    if isinstance(spec, Mapping):
        spec = apply_overrides(dict(spec), overrides)
    return validate_spec(spec, source=path)


def fingerprint(spec: Mapping[str, Any]) -> str:
    """SHA-256 of what determines the output: sources, transforms, seed, policy.

    The sink and storage credentials are left out, so the same pipeline
    written to another place has the same fingerprint.
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
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


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
