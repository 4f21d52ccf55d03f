"""Exceptions raised by slicefeed.

They live in one module and pickle cleanly, because they cross Ray worker
boundaries. Storage errors are builtins
(``FileNotFoundError``, ``PermissionError``) with the URI in the message; the
classes here cover what has no builtin.
"""

from __future__ import annotations


class SlicefeedError(Exception):
    """Base class for slicefeed's own errors."""


class SpecError(SlicefeedError, ValueError):
    """A pipeline spec, CLI argument or option is invalid (CLI exit code 2)."""


class NotCommittedError(SlicefeedError, FileNotFoundError):
    """A prefix holds no committed dataset (no ``_manifest.json``)."""


class AlreadyCommittedError(SlicefeedError, FileExistsError):
    """The sink already holds a committed dataset and overwrite was not asked for."""


class CorruptFileError(SlicefeedError, OSError):
    """A data file could not be decoded. The message names the file."""


class BadRecordError(SlicefeedError, ValueError):
    """A record failed validation or a transform. The message names file and row."""


class MissingColumnError(SpecError, KeyError):
    """A column named by a spec, a reader option or an argument does not exist.

    One type for every place that looks a column up (readers, ``read_dataset``,
    transforms, the loader); a ``SpecError`` for the CLI and a ``KeyError`` for
    callers that catch a missing key.
    """

    def __str__(self) -> str:
        # KeyError would quote the message; keep it readable.
        return str(self.args[0]) if self.args else ""
