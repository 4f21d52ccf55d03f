"""``gcp-storage-emulator`` that honours GCS write preconditions.

The stock emulator ignores ``ifGenerationMatch`` / ``ifGenerationNotMatch`` on
uploads, so a conditional create (``ifGenerationMatch=0``: "only if the object
does not exist") always succeeds there, while real GCS answers 412
Precondition Failed. Commit protocols must be tested against the real
precondition, so this module wraps the emulator's upload handler: the
precondition is checked, under a lock, against the object's current
generation before the stock handler runs, and a failed one is answered with
412 and a GCS-shaped JSON error. Everything else is the stock emulator.

Run as ``python tests/_gcs_emulator.py start --host ... --port ...`` (the
emulator's own command line).
"""

from __future__ import annotations

import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import server as _server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects as _objects

_LOCK = threading.Lock()
_STOCK_INSERT = _objects.insert


def _current_generation(storage, bucket: str, name: str) -> int:
    """The object's generation, 0 when it does not exist (GCS's convention)."""
    try:
        return int(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return 0


def _object_name(request) -> str | None:
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta")
        if isinstance(meta, dict):
            return meta.get("name")
        return data.get("name")
    return None


def _precondition_failed(response, message: str) -> None:
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({
        "error": {
            "code": 412,
            "message": message,
            "errors": [{"domain": "global", "reason": "conditionNotMet", "message": message}],
        }
    })


def insert(request, response, storage, *args, **kwargs):
    """The stock upload handler behind ``ifGenerationMatch`` / ``ifGenerationNotMatch``.

    Resumable uploads are checked when they are started (the object has to be
    absent, or at the generation, then), not again at the last chunk.
    """
    with _LOCK:
        match = request.query.get("ifGenerationMatch")
        not_match = request.query.get("ifGenerationNotMatch")
        if match or not_match:
            name = _object_name(request)
            if name is not None:
                gen = _current_generation(storage, request.params["bucket_name"], name)
                if match and gen != int(match[0]):
                    return _precondition_failed(
                        response, "At least one of the pre-conditions you specified did not hold."
                    )
                if not_match and gen == int(not_match[0]):
                    return _precondition_failed(
                        response, "At least one of the pre-conditions you specified did not hold."
                    )
        return _STOCK_INSERT(request, response, storage, *args, **kwargs)


def install() -> None:
    """Routes every upload through :func:`insert` (idempotent)."""
    _objects.insert = insert
    for _regex, handlers in _server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is _STOCK_INSERT:
                handlers[method] = insert


if __name__ == "__main__":
    install()
    from gcp_storage_emulator.__main__ import main

    sys.exit(main(sys.argv[1:]))
