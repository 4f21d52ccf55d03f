"""Retry policy for GCS: transient faults retried, permanent ones fail fast.

Two layers, both the libraries' own machinery, no hand-written loop:

1. **Per HTTP request, in gcsfs.** Every gcsfs call goes through
   ``GCSFileSystem._request``, decorated with ``gcsfs.retry.retry_request``:
   up to ``retries`` attempts (gcsfs default 6), sleeping
   ``min(random() + 2 ** (attempt - 1), 32)`` s between them (1-2, 2-3, 4-5,
   8-9, 16-17 s: at most ~36 s for 6 attempts). It retries what
   ``gcsfs.retry.is_retriable`` accepts: ``HttpError`` with status 408, 429,
   500-504 (502 arrives as ``requests.exceptions.ProxyError``), a 401
   "Invalid Credentials" (token refresh), and connection-level errors
   (``aiohttp.ClientError``: resets, truncated bodies, socket timeouts;
   ``google.auth`` refresh errors; checksum mismatches). 404 and 403 are never
   retried: gcsfs raises ``FileNotFoundError`` / ``OSError("Forbidden: ...")``
   at once. :class:`RetryingGCSFileSystem` re-applies that same decorator with
   a configurable attempt count, gives every request a socket timeout (gcsfs's
   default is none at all, so a server that stops answering would hang a job
   forever; with one, a stall becomes a retriable ``SocketTimeoutError``), and
   turns permanent failures into builtins naming the ``gs://`` URI and status.

2. **Per file operation, in Ray Data.** Ray Data wraps every filesystem it is
   given in ``RetryingPyFileSystem`` and retries file opens, batch reads and
   whole-file writes (10 attempts, backoff ``2**i`` s capped at 32 s, +-20%
   jitter) when the formatted exception matches one of
   ``DataContext.retried_io_errors``. Its defaults only name AWS errors;
   :func:`configure_ray_data_retries` adds :data:`TRANSIENT_MARKER`, which
   :class:`RetryingGCSFileSystem` attaches (as an exception note) to transient
   errors that outlived layer 1. So an outage longer than ~36 s is retried at
   file level, while permanent errors are never retried at all.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import urllib.parse
from typing import Any

if os.environ.get("STORAGE_EMULATOR_HOST"):
    # gcsfs reads this at import time (see _fs.py).
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import aiohttp
import gcsfs
from gcsfs.retry import HttpError, is_retriable, retry_request

from slicefeed.connectors._compat import gcsfs_undecorated_request
from slicefeed.connectors._errors import SpecError

__all__ = [
    "DEFAULT_RETRIES",
    "TRANSIENT_MARKER",
    "RetryingGCSFileSystem",
    "configure_ray_data_retries",
]

#: Attempts per HTTP request (gcsfs's own default).
DEFAULT_RETRIES = 6
#: Seconds to open a connection / to wait for the next bytes of a response.
#: Generous: a healthy GCS answers in well under a second.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 120.0

#: Added as a note to transient errors that outlived gcsfs's retries; matched
#: by Ray Data's ``retried_io_errors`` (see :func:`configure_ray_data_retries`).
#: No regular-expression metacharacters: it matches itself whether Ray Data
#: matches those entries as substrings or as patterns (it warns that it will
#: move to patterns).
TRANSIENT_MARKER = "slicefeed: transient GCS error"

# The undecorated request method: we re-apply gcsfs's own retry decorator
# (None if gcsfs dropped the hook: its default retries then apply).
_BASE_REQUEST = gcsfs_undecorated_request()

_BUCKET_RE = re.compile(r"(?:^|/)b/([^/?]+)(?:/o(?:/([^?]*))?)?")


@functools.cache
def _retrying_request(retries: int):
    if _BASE_REQUEST is None:
        return gcsfs.GCSFileSystem._request
    return retry_request(retries=retries)(_BASE_REQUEST)


def _gs_uri(path: str, args: tuple, params: dict[str, Any]) -> str:
    """The gs:// URI a gcsfs request is about, from its URL template and args."""
    try:
        url = path.format(*[urllib.parse.quote(str(a), safe="") for a in args]) if args else path
    except (IndexError, KeyError):
        url = path
    m = _BUCKET_RE.search(urllib.parse.urlsplit(url).path)
    if not m:
        return "gs://"
    bucket = urllib.parse.unquote(m.group(1))
    key = urllib.parse.unquote(m.group(2) or "") or str(params.get("name") or params.get("prefix") or "")
    return f"gs://{bucket}/{key}" if key else f"gs://{bucket}"


def _server_message(e: BaseException) -> str:
    # gcsfs: "Forbidden: <url>\n<server message>"; HttpError: "<message>, <code>".
    text = str(e).split("\n", 1)[1] if "\n" in str(e) else str(getattr(e, "message", "") or "")
    return text.strip()[:300]


class RetryingGCSFileSystem(gcsfs.GCSFileSystem):
    """gcsfs with slicefeed's retry policy (see the module docstring).

    Accepts every ``gcsfs.GCSFileSystem`` argument plus ``retries`` (attempts
    per HTTP request). Pickles like gcsfs (it is rebuilt from its arguments),
    so Ray workers get the same policy.
    """

    protocol = ("gs", "gcs")

    def __init__(self, *args: Any, retries: int = DEFAULT_RETRIES, **kwargs: Any):
        if int(retries) < 1:
            raise SpecError(f"retries must be >= 1 (attempts per request), got {retries}")
        if kwargs.get("requests_timeout") is None:
            kwargs["requests_timeout"] = aiohttp.ClientTimeout(
                total=None,
                sock_connect=DEFAULT_CONNECT_TIMEOUT_S,
                sock_read=DEFAULT_READ_TIMEOUT_S,
            )
        token = kwargs.get("token")
        try:
            super().__init__(*args, **kwargs)
        except Exception as e:
            if not (isinstance(token, dict) or (isinstance(token, str) and os.path.isfile(token))):
                raise
            # Neither the key's path nor its contents go into the message, and
            # the chain (which google-auth/gcsfs fill with parsing details) is
            # dropped.
            raise SpecError(
                "credentials: the service-account key could not be loaded "
                f"({type(e).__name__}). Pass a JSON key file of type 'service_account' "
                "(IAM > Service accounts > Keys), or leave credentials unset to use "
                "application-default credentials / Workload Identity."
            ) from None
        self.retries = int(retries)
        if "ray.data" in sys.modules:
            # A driver that uses Ray Data gets layer 2 without another call.
            configure_ray_data_retries()

    async def _request(self, method, path, *args, **kwargs):
        try:
            return await _retrying_request(self.retries)(self, method, path, *args, **kwargs)
        except FileNotFoundError as e:
            uri = _gs_uri(path, args, kwargs)
            raise FileNotFoundError(
                f"{uri}: not found (HTTP 404 from GCS). Check the bucket and object name."
            ) from e
        except HttpError as e:
            uri = _gs_uri(path, args, kwargs)
            if e.code == 401:
                raise PermissionError(
                    f"{uri}: unauthenticated (HTTP 401 from GCS: {_server_message(e)}). "
                    "The credentials are missing, expired or invalid; pass credentials= "
                    "(a service-account key file) or run "
                    "`gcloud auth application-default login`."
                ) from e
            if is_retriable(e):
                e.add_note(f"{TRANSIENT_MARKER}: {method} {uri} failed {self.retries} times")
            raise
        except OSError as e:
            if str(e).startswith("Forbidden"):
                uri = _gs_uri(path, args, kwargs)
                # Keep the "Forbidden" prefix: gcsfs._get_object falls back to a
                # listing on it.
                raise PermissionError(
                    f"Forbidden: {uri}: permission denied (HTTP 403 from GCS: "
                    f"{_server_message(e)}). Grant the account in use access to the "
                    "bucket (roles/storage.objectViewer to read, "
                    "roles/storage.objectAdmin to write) or pass other credentials."
                ) from e
            if is_retriable(e):
                e.add_note(f"{TRANSIENT_MARKER}: {method} {_gs_uri(path, args, kwargs)}")
            raise
        except Exception as e:
            if is_retriable(e):
                e.add_note(
                    f"{TRANSIENT_MARKER}: {method} {_gs_uri(path, args, kwargs)} "
                    f"failed {self.retries} times"
                )
            raise


def configure_ray_data_retries(context: Any = None) -> None:
    """Makes Ray Data retry file operations that failed on a transient GCS error.

    Adds :data:`TRANSIENT_MARKER` to ``DataContext.retried_io_errors`` (once).
    Ray ships the driver's DataContext with each job, so call it in the driver
    before building the dataset.

    Args:
        context: A ``ray.data.DataContext``; default: the current one.
    """
    if context is None:
        from ray.data import DataContext

        context = DataContext.get_current()
    errors = list(context.retried_io_errors)
    if TRANSIENT_MARKER not in errors:
        context.retried_io_errors = [*errors, TRANSIENT_MARKER]
