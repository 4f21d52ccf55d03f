"""The one place that turns a URI into a filesystem and a path.

``gs://`` goes through gcsfs; local paths and ``file://`` through fsspec's
local filesystem; any other protocol fsspec knows (``memory://``, ``s3://``
when ``s3fs`` is installed, ...) through fsspec. Ray Data gets the fsspec
filesystem as is: it wraps it in ``pyarrow.fs.PyFileSystem(FSSpecHandler(...))``
itself.

Credentials never appear in what this module logs or raises: messages name
the URI and, for a key file, only that a key file was used.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import fsspec

from slicefeed.connectors._errors import SpecError, printable

_GLOB_CHARS = set("*?[")


@dataclasses.dataclass(frozen=True)
class ResolvedPath:
    """A URI resolved to an fsspec filesystem and a protocol-less path.

    Attributes:
        uri: The URI as the user wrote it (normalised for ``file://``).
        fs: The fsspec filesystem that serves it (picklable; ships to Ray workers).
        path: The path on ``fs`` (``bucket/prefix`` for gs://, absolute for local).
        protocol: ``"gs"``, ``"file"``, or another fsspec protocol.
    """

    uri: str
    fs: fsspec.AbstractFileSystem
    path: str
    protocol: str

    def join(self, *parts: str) -> ResolvedPath:
        """The resolved path of ``parts`` under this one, on the same filesystem."""
        path = "/".join([self.path.rstrip("/"), *[p.strip("/") for p in parts]])
        return dataclasses.replace(self, uri=self.to_uri(path), path=path)

    def to_uri(self, path: str) -> str:
        """The URI a user would write for ``path`` on this filesystem."""
        if self.protocol == "file":
            return path
        return f"{self.protocol}://{path}"


def _split_protocol(uri: str) -> tuple[str, str]:
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        return protocol.lower(), rest
    return "file", uri


def canonical_uri(uri: str | os.PathLike[str]) -> str:
    """The URI :func:`resolve_filesystem` resolves ``uri`` to, without touching storage.

    ``gs://`` and ``gcs://`` become ``gs://bucket/prefix`` without leading or
    trailing ``/`` (a ``//`` inside is kept: on GCS ``raw//a`` and ``raw/a`` are
    two object names); a local path or ``file://`` URI becomes the absolute,
    normalised path (``~`` expanded, ``.`` and doubled or trailing ``/``
    dropped; relative paths are resolved against the working directory);
    any other URI is kept as written. Two URIs with the same canonical form
    name the same files, so a pipeline fingerprints this form.
    """
    uri = os.fspath(uri)
    protocol, rest = _split_protocol(uri)
    if protocol in ("gs", "gcs"):
        return f"gs://{rest.strip('/')}"
    if protocol == "file":
        return os.path.abspath(os.path.expanduser(rest))
    return uri


def _gcs_filesystem(
    *, token: Any, project: str | None, storage_options: dict[str, Any]
) -> fsspec.AbstractFileSystem:
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        # gcsfs reads this at import time; against an emulator the experimental
        # zonal/HNS probe stalls a minute per bucket.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    from slicefeed.connectors._retry import RetryingGCSFileSystem

    kwargs: dict[str, Any] = dict(storage_options)
    kwargs.setdefault("token", token)
    if project is not None:
        kwargs.setdefault("project", project)
    return RetryingGCSFileSystem(**kwargs)


def resolve_filesystem(
    uri: str | os.PathLike[str],
    *,
    credentials: str | os.PathLike[str] | None = None,
    anonymous: bool | None = None,
    project: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ResolvedPath:
    """Resolves ``uri`` to a filesystem and a path on it.

    Args:
        uri: ``gs://bucket/prefix``, a local path, ``file:///abs/path``, or any
            fsspec URI. Glob characters are kept in ``path``; see
            :func:`expand_paths`.
        credentials: For ``gs://``: path to a service-account key file. Default:
            application-default credentials (``google_default``).
        anonymous: For ``gs://``: no credentials at all (public buckets, emulators).
            Defaults to True when ``STORAGE_EMULATOR_HOST`` is set.
        project: GCP project for ``gs://`` (listing buckets, requester pays).
        storage_options: Extra keyword arguments for the fsspec filesystem.

    Returns:
        A :class:`ResolvedPath`.

    Raises:
        SpecError: If both ``credentials`` and ``anonymous=True`` are given.
    """
    uri = os.fspath(uri)
    storage_options = dict(storage_options or {})
    protocol, _ = _split_protocol(uri)
    if protocol in ("gs", "gcs"):
        if credentials is not None and anonymous:
            raise SpecError(
                f"{uri}: pass either credentials= (a key file) or anonymous=True, not both."
            )
        if anonymous is None:
            anonymous = bool(os.environ.get("STORAGE_EMULATOR_HOST")) and credentials is None
        if anonymous:
            token: Any = "anon"
        elif credentials is not None:
            key = os.fspath(credentials)
            if not os.path.exists(key):
                raise FileNotFoundError(
                    f"{uri}: the service-account key file given as credentials does not "
                    "exist; pass the path of a JSON key file, or leave credentials unset "
                    "to use application-default credentials."
                )
            token = key
        else:
            token = "google_default"
        fs = _gcs_filesystem(token=token, project=project, storage_options=storage_options)
        canonical = canonical_uri(uri)
        return ResolvedPath(uri=canonical, fs=fs, path=canonical[len("gs://"):], protocol="gs")
    if protocol == "file":
        fs = fsspec.filesystem("file", **storage_options)
        path = canonical_uri(uri)
        return ResolvedPath(uri=path, fs=fs, path=path, protocol="file")
    fs, path = fsspec.core.url_to_fs(uri, **storage_options)
    return ResolvedPath(uri=uri, fs=fs, path=path, protocol=protocol)


def has_glob(path: str) -> bool:
    """Whether ``path`` contains glob characters (``*``, ``?``, ``[``)."""
    return any(c in _GLOB_CHARS for c in path)


def is_pattern(fs: Any, path: str) -> bool:
    """Whether ``path`` is a glob: it has glob characters and names nothing as
    written. A path that exists is taken literally (a folder named ``in ?x``)."""
    return has_glob(path) and not fs.exists(path)


def literal_base(fs: Any, path: str) -> str:
    """The folder every file ``path`` names lies under, without a trailing
    ``/``: the folder itself, a file's folder, or a glob's folders before its
    first component with a glob character (``raw/*/a.jsonl`` -> ``raw``), so a
    file's path below it tells apart files of one name in several folders."""
    if is_pattern(fs, path):
        parts = path.split("/")
        first = next(i for i, part in enumerate(parts) if has_glob(part))
        return "/".join(parts[:first])
    if fs.isdir(path):
        return path.rstrip("/")
    return path.rsplit("/", 1)[0] if "/" in path else ""


def expand_paths(resolved: ResolvedPath, *, suffixes: tuple[str, ...] = (),
                 left_out: list[str] | None = None) -> list[str]:
    """Lists the files ``resolved`` names, sorted: a file, a directory, or a glob.

    Directories are walked recursively; hidden and underscore-prefixed files
    (``_manifest.json``, ``.crc``) are skipped, as Ray Data does, and when
    ``suffixes`` is given only files ending in one of them are kept (the
    others are appended to ``left_out`` when given, for the caller to report).
    A glob or a single file is taken as written; a path that exists is not a
    glob (see :func:`is_pattern`).

    Raises:
        FileNotFoundError: naming the URI when nothing matches.
    """
    fs, path = resolved.fs, resolved.path
    pattern = is_pattern(fs, path)
    other: list[str] = []
    if pattern:
        found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
    elif fs.isdir(path):
        found = []
        for p in sorted(fs.find(path)):
            if any(part.startswith(("_", ".")) for part in p[len(path):].split("/")):
                continue
            (found if not suffixes or p.endswith(suffixes) else other).append(p)
    elif fs.exists(path):
        found = [path]
    else:
        found = []
    if left_out is not None:
        left_out.extend(other)
    if not found and other:
        raise FileNotFoundError(
            f"No file in {resolved.uri} is named *{', *'.join(suffixes)}; {len(other)} other "
            f"file(s) are, such as {printable(other[0][len(path):].lstrip('/'), 80)!r}. Name "
            "the files so, or give a glob that names them (a glob reads what it matches).")
    if not found:
        what = "matches the pattern" if pattern else "exists at"
        raise FileNotFoundError(
            f"No file {what} {resolved.uri}. Check the URI (gs://bucket/prefix, a local "
            "path, or a glob such as gs://bucket/raw/*.parquet) and that your "
            "credentials can list it."
        )
    # fsspec's local filesystem returns absolute paths; gcsfs returns bucket/key.
    return found
