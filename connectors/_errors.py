"""Exceptions raised by slicefeed.

They live in one module and pickle cleanly, because they cross Ray worker
boundaries. Storage errors are builtins
(``FileNotFoundError``, ``PermissionError``) with the URI in the message; the
classes here cover what has no builtin.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class SlicefeedError(Exception):
    """Base class for slicefeed's own errors."""


class SpecError(SlicefeedError, ValueError):
    """A pipeline spec, CLI argument or option is invalid (CLI exit code 2)."""


class NotCommittedError(SlicefeedError, FileNotFoundError):
    """A prefix holds no committed dataset (no manifest version), or not the version asked for."""


class AlreadyCommittedError(SlicefeedError, FileExistsError):
    """The sink already holds a committed dataset and overwrite was not asked for."""


class CorruptFileError(SlicefeedError, OSError):
    """A data file could not be decoded. The message names the file."""


class BadRecordError(SlicefeedError, ValueError):
    """A record failed validation or a transform. The message names file and row."""


class CorruptManifestError(SlicefeedError, ValueError):
    """A manifest does not validate (bad JSON, paths, counts or schema). Names the file."""


class CommitConflictError(SlicefeedError, RuntimeError):
    """Another writer committed the version this writer tried to create.

    ``version`` is the version the other writer won (read it with
    ``read_manifest(uri, version=...)``); this writer committed nothing and
    removed its own shards.
    """

    def __init__(self, message: str, version: int | None = None):
        super().__init__(message)
        self.version = version

    def __reduce__(self):
        return (type(self), (str(self), self.version))


class ShardMismatchError(SlicefeedError, OSError):
    """A shard differs from what its manifest records (size, checksum, rows). Names it."""


class MissingColumnError(SpecError, KeyError):
    """A column named by a spec, a reader option or an argument does not exist.

    One type for every place that looks a column up (readers, ``read_dataset``,
    transforms, the loader); a ``SpecError`` for the CLI and a ``KeyError`` for
    callers that catch a missing key.
    """

    def __str__(self) -> str:
        # KeyError would quote the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class WorkerCrashError(SlicefeedError, RuntimeError):
    """A task's worker process died on the same input more often than retries allow.

    The message names the input file(s) and the transform(s) of the task.
    """


#: Longest quotation of user data in a message (spec values, record text).
QUOTE_LIMIT = 120


def printable(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` for a message, unquoted: control characters escaped, at most ``limit`` chars.

    For text that comes from data (column names, reasons quoting records), so
    it cannot add lines or terminal escape sequences to a message.
    """
    text = str(text)
    cut = len(text) > limit
    text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{text}..." if cut else text


def typed_columns(fields: Iterable[Any], limit: int = 20) -> str:
    """``a: int64, b: string`` for a message: the first ``limit`` of an Arrow
    schema's (or any iterable of fields') columns, each name bounded by
    :func:`printable` (and each type: a struct's lists its fields), then
    `` ... (N more)``."""
    fields = list(fields)
    shown = ", ".join(f"{printable(f.name, 60)}: {printable(str(f.type), 200)}"
                      for f in fields[:limit])
    return shown + (f" ... ({len(fields) - limit} more)" if len(fields) > limit else "")


def task_error_cause(error: BaseException) -> BaseException | None:
    """The exception a Ray task raised, from the ``ray.exceptions.RayTaskError``
    that ``ray.get`` raises for it (its ``cause``), or None: re-raised, a
    task's named error leads the message instead of Ray's traceback of the
    task."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else None


def type_name(value: object) -> str:
    """The name a spec writer knows ``value``'s type by: YAML's (``string``,
    ``integer``, ``boolean``, ``mapping``...), else the Python type's name."""
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def short_repr(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for messages: control characters escaped, at most ``limit`` chars.

    Strings and bytes are cut before ``repr`` so a huge value costs nothing;
    containers are rendered, then cut. The result never contains a raw control
    character (newlines, escape sequences), so attacker-written text cannot
    forge lines in logs or terminals.
    """
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} {'chars' if isinstance(value, str) else 'bytes'})"
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # repr is slow, or refused
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any object's repr may fail; the message must not
        return f"a {type(value).__name__} that cannot be shown"
    # repr escapes control characters in str/bytes; containers of other
    # objects may not, so escape what is left.
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} chars)"
    return text
