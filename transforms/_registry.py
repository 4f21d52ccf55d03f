"""The transform registry and YAML argument parsing.

Defining a :class:`~slicefeed.transforms.Transform` subclass with a ``name``
registers it in :data:`TRANSFORMS`; :func:`transform_from_spec` turns a YAML
item (``{rename: {mapping: {a: b}}}``) into an instance, with errors that name
the transform, the argument and the allowed arguments.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import decimal
import functools
import json
import numbers
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from slicefeed.connectors import SpecError, printable, short_repr, type_name

if typing.TYPE_CHECKING:  # pragma: no cover
    from slicefeed.transforms._contract import Transform

__all__ = ["TRANSFORMS", "check_transforms", "get_transform", "register", "transform_from_spec"]

#: Transform classes by their YAML name.
TRANSFORMS: dict[str, type[Transform]] = {}

_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def register(name: str, cls: type[Transform]) -> None:
    """Registers ``cls`` under ``name`` (called by ``Transform.__init_subclass__``).

    Raises:
        ValueError: ``name`` is not snake_case or is taken by another class.
    """
    if not _SNAKE.match(name):
        raise ValueError(f"transform name {name!r} must be snake_case")
    if name in TRANSFORMS and TRANSFORMS[name].__qualname__ != cls.__qualname__:
        raise ValueError(f"transform name {name!r} is taken by {TRANSFORMS[name].__qualname__}")
    TRANSFORMS[name] = cls


def default_of(f: dataclasses.Field) -> Any:
    """The default of a dataclass field (``dataclasses.MISSING`` if required)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def plain(v: Any) -> Any:
    """``v`` with tuples as lists and mappings as dicts (a YAML-ready value)."""
    if isinstance(v, tuple):
        return [plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: plain(x) for k, x in v.items()}
    return v


def typed(v: Any, hint: Any) -> Any:
    """:func:`plain` ``v``, with each integer the argument's type declares a float
    (``p: float`` given ``1``) made that float, so both spellings are one value.

    ``hint`` is the field's resolved annotation (``float``, ``tuple[float, ...] |
    float``, ``dict[str, float] | None``, ...); anything else is left as it is.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if isinstance(v, int) and not isinstance(v, bool):
            return float(v) if float in args and int not in args else v
        for a in args:
            if isinstance(v, (list, tuple)) and typing.get_origin(a) in (tuple, list):
                return typed(v, a)
            if isinstance(v, Mapping) and typing.get_origin(a) is dict:
                return typed(v, a)
        return plain(v)
    if hint is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if origin in (tuple, list) and isinstance(v, (list, tuple)):
        item = args[0] if args else Any
        return [typed(x, item) for x in v]
    if origin is dict and isinstance(v, Mapping) and len(args) == 2:
        return {k: typed(x, args[1]) for k, x in v.items()}
    return plain(v)


def json_form(value: Any) -> Any:
    """``value`` as JSON values that keep apart what a YAML spec keeps apart, for
    a fingerprint: ``json.dumps`` would write a value JSON has no type for (a
    YAML date or timestamp, ``!!binary`` bytes, a ``!!set``) as text equal to
    a string's, and a mapping key that is not a string (``1``) as that string.

    Such a value becomes ``{"$": [type name, its text]}`` and such a key
    ``"$<type name>:<repr>"``; a string key that starts with ``$`` gets another
    ``$``, so no mapping in a spec takes either form. Other values keep their
    form (tuples as lists), so a spec without any of these is unchanged.
    """
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if isinstance(k, str):
                key = "$" + k if k.startswith("$") else k
            else:
                key = f"${type(k).__name__}:{k!r}"
            out[key] = json_form(v)
        return out
    if isinstance(value, (list, tuple)):
        return [json_form(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (set, frozenset)):
        text: Any = sorted(json.dumps(json_form(v), sort_keys=True) for v in value)
    elif isinstance(value, (datetime.date, datetime.time)):
        text = value.isoformat()
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).hex()
    else:
        text = repr(value)
    return {"$": [type(value).__name__, text]}


def field_types(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field annotations (empty where they do not resolve)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a name only imported for type checking: no coercion
        return {}


@functools.cache
def _init_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(name, resolved annotation)`` of each argument of ``cls``. Where the
    class's annotations do not all resolve (a name only a function's scope
    knew), each is resolved on its own, so one such field leaves only itself
    unchecked."""
    hints = field_types(cls)
    if not hints:
        import sys

        scope = dict(vars(sys.modules.get(cls.__module__, typing)))
        for f in dataclasses.fields(cls):
            hint = _resolved(f.type, scope)
            if hint is not None:
                hints[f.name] = hint
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in hints)


def _resolved(annotation: Any, scope: dict[str, Any]) -> Any:
    """``annotation`` (a string under ``from __future__ import annotations``)
    evaluated in its module's ``scope``, as ``typing.get_type_hints`` does; None
    where it names what that scope does not hold."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, scope)
    except Exception:  # noqa: BLE001 - unresolvable: that argument is the transform's to check
        return None


def _expected(value: Any, hint: Any) -> str | None:
    """What ``hint`` (a field's resolved annotation) asks for, in words, where
    ``value`` is not of it; ``None`` where it is, or where the annotation is one
    this check does not read (the transform checks those itself).

    A boolean is not a number here, and a string is not a boolean: YAML's
    ``"false"`` (quoted) or ``1`` given for a flag would otherwise be true. A
    string or a mapping where a list is declared is not that list (``vocab:
    abc`` would be three letters).
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        wants = [_expected(value, a) for a in args]
        if None in wants:
            return None
        if "a number" in wants:  # int | float: an integer is a number
            wants = [w for w in wants if w != "an integer"]
        return " or ".join(dict.fromkeys(wants))
    if hint is type(None):
        return None if value is None else "null"
    if origin is typing.Literal:
        return None if any(value == a and type(value) is type(a) for a in args) else \
            "one of " + ", ".join(short_repr(a, 40) for a in args)
    if hint is bool:
        return None if isinstance(value, (bool, np.bool_)) else "true or false"
    flag = isinstance(value, (bool, np.bool_))
    if hint is int:
        return None if isinstance(value, numbers.Integral) and not flag else "an integer"
    if hint is float:
        number = isinstance(value, (numbers.Real, decimal.Decimal)) and not flag
        return None if number else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin in (tuple, list, collections.abc.Sequence) and args:
        if isinstance(value, (str, bytes, Mapping)):
            return f"a list of {_plural(args[0])}"
        if not isinstance(value, (list, tuple)):
            return None  # another value where a list is wanted: the transform says what it takes
        return None if _bad_item(value, hint) is None else f"a list of {_plural(args[0])}"
    if origin in (dict, collections.abc.Mapping) and len(args) == 2 and isinstance(value, Mapping):
        return None if _bad_item(value, hint) is None else \
            f"a mapping of {_plural(args[0])} to {_plural(args[1])}"
    return None


def _bad_item(value: Any, hint: Any) -> str | None:
    """The first item of a list or mapping ``value`` not of its place in ``hint``
    (``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]``, ``dict[K, V]``), in words."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (dict, collections.abc.Mapping):
        for k, v in value.items():
            if _expected(k, args[0]) is not None or _expected(v, args[1]) is not None:
                return f"key {short_repr(k, 60)}: {short_repr(v, 60)}"
        return None
    fixed = origin is tuple and Ellipsis not in args
    if fixed and len(value) != len(args):
        return f"{len(value)} items, not {len(args)}"
    for i, x in enumerate(value):
        if _expected(x, args[i] if fixed else args[0]) is not None:
            return f"item {i} is {short_repr(x, 60)}"
    return None


def _plural(hint: Any) -> str:
    return {bool: "booleans", int: "integers", float: "numbers", str: "strings"}.get(hint, "values")


#: Types by the names a YAML writer knows them (``type_name``), with their article.
_KNOWN_KINDS = {"string": "a", "integer": "an", "number": "a", "boolean": "a", "mapping": "a",
                "list": "a", "null": "a"}
#: Text YAML reads as a number or a boolean when it is not quoted.
_UNQUOTED_SCALAR = re.compile(r"^\s*([-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?|true|false)\s*$",
                              re.IGNORECASE)
#: YAML 1.1's other booleans, which the spec loader (YAML 1.2) reads as text.
_YAML_1_1_BOOLS = {"yes", "no", "on", "off", "y", "n"}


def _hint(value: Any, want: str) -> str:
    """How to write what ``want`` asks for, where ``value`` shows the likely slip."""
    if value is None:
        return "; leave the argument out for its default"
    if isinstance(value, str) and "string" not in want and _UNQUOTED_SCALAR.match(value):
        return "; in YAML, write it without quotes"
    if isinstance(value, str) and "true or false" in want and value.lower() in _YAML_1_1_BOOLS:
        return "; write true or false (YAML 1.2 reads yes/no/on/off as text)"
    if "string" in want and not isinstance(value, (str, list, tuple, Mapping)):
        return '; in YAML, quote it ("...")'
    if want.startswith("an integer") and isinstance(value, float):
        return "; give a whole number"
    return ""


def _plain_scalar(value: Any) -> Any:
    """A NumPy scalar as the Python number or bool it holds (so fingerprints,
    ``to_spec`` and a transform's own checks see plain values); else ``value``."""
    return value.item() if isinstance(value, np.generic) else value


def check_argument_types(t: Any) -> None:
    """Refuses a transform argument whose value is not of its declared type
    (``seed: "1"``, ``horizontal: "no"``, ``min_count: 1.5``, ``column: 1``),
    naming the argument, what it takes, what it got (the first bad item of a
    list or mapping) and how to write it; an integer where a number is
    declared is a number. A NumPy scalar argument becomes the Python value it
    holds.

    Called for every transform when it is built (``Transform.__post_init__``),
    from YAML or Python alike, so a value of another type never reaches the
    transform's own checks, where a non-empty string would count as true.

    Raises:
        SpecError: naming the transform and the argument.
    """
    for name, hint in _init_types(type(t)):
        value = getattr(t, name)
        want = _expected(value, hint)
        if want is None:
            plain = _plain_scalar(value)
            if plain is not value:
                object.__setattr__(t, name, plain)
            continue
        kind = type_name(value)
        got = f"{_KNOWN_KINDS[kind]} {kind}" if kind in _KNOWN_KINDS else f"of type {kind}"
        arm = _container_arm(hint, value)
        item = None if arm is None else _bad_item(value, arm)
        raise t._spec_error(
            f"argument {name!r} must be {want}; got {short_repr(value)} ({got})"
            + (f", where {item}" if item else "") + _hint(value, want)
        )


def _container_arm(hint: Any, value: Any) -> Any:
    """The list or mapping annotation in ``hint`` (maybe a union) that ``value``'s kind fits."""
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for a in arms:
        origin = typing.get_origin(a)
        if isinstance(value, Mapping) and origin in (dict, collections.abc.Mapping) and len(typing.get_args(a)) == 2:
            return a
        if isinstance(value, (list, tuple)) and origin in (tuple, list, collections.abc.Sequence) and typing.get_args(a):
            return a
    return None


def _ensure_registered() -> None:
    # Importing the package registers every built-in transform.
    import slicefeed.transforms  # noqa: F401


def get_transform(name: str) -> type[Transform]:
    """The transform class registered under ``name``.

    Raises:
        SpecError: listing the allowed names when ``name`` is unknown.
    """
    _ensure_registered()
    try:
        return TRANSFORMS[name]
    except (KeyError, TypeError):
        raise SpecError(
            f"unknown transform {short_repr(name)}; allowed: {', '.join(sorted(TRANSFORMS))}"
        ) from None


def transform_from_spec(item: Mapping[str, Any] | str) -> Transform:
    """Builds a transform from a YAML spec item.

    Args:
        item: ``{"rename": {"mapping": {"a": "b"}}}``; a bare name (``"deduplicate"``)
            or ``{"name": None}`` for a transform without required arguments.

    Raises:
        SpecError: naming the transform and the unknown/missing/invalid argument
            and listing the allowed arguments.
    """
    if isinstance(item, str):
        name, args = item, {}
    elif isinstance(item, Mapping) and len(item) == 1:
        ((name, args),) = item.items()
    else:
        raise SpecError(
            f"a transform must be written as a mapping with one key, the transform "
            f"name, e.g. {{rename: {{mapping: {{a: b}}}}}}; got {short_repr(item)}"
        )
    cls = get_transform(name)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise SpecError(
            f"{name}: arguments must be a mapping of argument names to values; got "
            f"{short_repr(args)}. Allowed arguments: {_arg_list(cls)}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in args if k not in fields]
    if unknown:
        raise SpecError(
            f"{name}: unknown argument {short_repr(unknown[0])}; allowed arguments: {_arg_list(cls)}"
        )
    missing = [
        k for k, f in fields.items() if default_of(f) is dataclasses.MISSING and k not in args
    ]
    if missing:
        raise SpecError(
            f"{name}: missing required argument {missing[0]!r}; allowed arguments: "
            f"{_arg_list(cls)}"
        )
    try:
        return cls(**dict(args))
    except SpecError:
        raise
    except (TypeError, ValueError) as e:
        raise SpecError(
            f"{name}: invalid arguments ({printable(str(e), 300)}); allowed arguments: {_arg_list(cls)}"
        ) from e


def _arg_list(cls: type[Transform]) -> str:
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        d = default_of(f)
        out.append(f.name if d is dataclasses.MISSING else f"{f.name}={plain(d)!r}")
    return ", ".join(out) or "(none)"


def check_transforms(schema: pa.Schema, transforms: Iterable[Transform]) -> pa.Schema:
    """Folds :meth:`Transform.output_schema` over ``transforms``; the final schema."""
    for t in transforms:
        schema = t.output_schema(schema)
    return schema
