"""Exceptions raised by slicefeed.

They live in one module and pickle cleanly, because they cross Ray worker
boundaries (STYLE.md, "Errors"). Storage errors are builtins
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
