"""Multi-host agreement through jax.distributed's key-value store (never a device collective).

Each loader gets a key namespace numbered in creation order, so loaders must be
created in the same order on every host. Waiting is a server-side wait in short slices,
so a stop request (``close()``, the loader being garbage-collected) ends the
wait within one slice instead of after the timeout.
"""

from __future__ import annotations

import itertools
import threading
import time

from slicefeed.connectors import _compat

_KV_PREFIX = "slicefeed/jaxloader"
_WAIT_S = 0.05  # longest single wait for a key (how soon a stop request is noticed)
_counter = itertools.count()


class Stopped(Exception):
    """The wait was interrupted by a stop request (internal; never reaches the user)."""


class Agreement:
    """All hosts' values for a tag, through the key-value store."""

    def __init__(self, process_index: int, process_count: int, timeout_s: float):
        self.process_index = process_index
        self.process_count = process_count
        self.timeout_s = float(timeout_s)
        self.uid = next(_counter)
        self.generation = 0

    def next_generation(self) -> Agreement:
        """The same agreement under fresh keys (a restarted producer)."""
        out = Agreement.__new__(Agreement)
        out.__dict__.update(self.__dict__)
        out.generation = self.generation + 1
        return out

    @property
    def _ns(self) -> str:
        return f"{_KV_PREFIX}/{self.uid}.{self.generation}"

    def _client(self):
        client = _compat.jax_kv_client()
        if client is None:
            raise RuntimeError(
                "JaxLoader: jax.process_count() > 1 but jax.distributed has no client; "
                "call jax.distributed.initialize() before creating the loader."
            )
        return client

    def exchange(self, tag: str, value: str, stop: threading.Event | None = None) -> list[str]:
        """Every host's ``value`` for ``tag``, in host order.

        Raises:
            TimeoutError: a host did not report within ``timeout_s``.
            Stopped: ``stop`` was set while waiting.
        """
        if self.process_count == 1:
            return [value]
        client = self._client()
        prefix = f"{self._ns}/{tag}"
        client.key_value_set(f"{prefix}/{self.process_index}", value)
        out: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        for h in range(self.process_count):
            if h == self.process_index:
                out.append(value)
                continue
            while True:
                # A server-side wait answers as soon as the key is set (a poll loop
                # overshoots by up to its sleep, once per exchange); waiting in slices
                # of _WAIT_S notices a stop request.
                t = time.monotonic()
                left = deadline - t
                got = _compat.kv_wait(client, f"{prefix}/{h}", 1000 * min(_WAIT_S, max(left, 0)))
                if got is not None:
                    out.append(got)
                    break
                if stop is not None and stop.is_set():
                    raise Stopped(tag)
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"JaxLoader: host {h} did not report {tag!r} within {self.timeout_s} s "
                        f"(is it running the same loader, created in the same order?)."
                    )
                if time.monotonic() - t < _WAIT_S / 10:
                    time.sleep(_WAIT_S / 10)  # the store answered at once without a value
        return out

    def forget(self, tag: str) -> None:
        """Deletes this host's key for ``tag`` (best effort: keys are tiny)."""
        if self.process_count == 1:
            return
        try:
            self._client().key_value_delete(f"{self._ns}/{tag}/{self.process_index}")
        except Exception:  # noqa: BLE001, S110 - best effort: keys are tiny
            pass
