"""Multi-host agreement through jax.distributed's key-value store (never a device collective).

Each loader gets a key namespace numbered in creation order, so loaders must be
created in the same order on every host. Waiting is a server-side wait in short slices,
so a stop request (``close()``, the loader being garbage-collected) ends the
wait within one slice instead of after the timeout.

An exchange has two phases, so that either every host acts on a tag or none does:

1. every host sets its value and waits (at most ``timeout_s``) for every other
   host's value;
2. one decision per tag is created in the store, first writer wins (the store
   refuses to overwrite a key): ``go`` by a host that saw every value, an abort
   by a host that timed out or failed (:meth:`Agreement.fail`). Every host
   follows the decision it finds there.

A value alone cannot decide: a host that gave up after its wait still has its
value in the store, and a host arriving later would otherwise take it as an
agreement and enter the steps (and the collectives in them) alone.
"""

from __future__ import annotations

import itertools
import threading
import time

from slicefeed.connectors import _compat, printable

_KV_PREFIX = "slicefeed/jaxloader"
_WAIT_S = 0.05  # longest single wait for a key (how soon a stop request is noticed)
_GO = "go"
_ABORT = "abort"  # value: "abort\n<kind>\n<host>\n<message>"; kind: timeout | failed
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
        """Every host's ``value`` for ``tag``, in host order, once every host has
        agreed to act on it (see the module docstring).

        Raises:
            TimeoutError: a host did not report within ``timeout_s`` (this host's
                wait, or another host's, which then aborted the tag for all).
            RuntimeError: another host failed before reporting ``tag`` (see
                :meth:`fail`).
            Stopped: ``stop`` was set while waiting (nothing is decided: the
                other hosts time out naming this host).
        """
        if self.process_count == 1:
            return [value]
        client = self._client()
        prefix = f"{self._ns}/{tag}"
        client.key_value_set(f"{prefix}/{self.process_index}", value)
        deadline = time.monotonic() + self.timeout_s
        values: dict[int, str] = {self.process_index: value}
        abort: str | None = None
        for h in range(self.process_count):
            if h in values:
                continue
            # Stopped propagates without a decision: close() returns within one
            # wait slice; the other hosts then time out naming this host.
            got = self._wait(client, f"{prefix}/{h}", deadline, stop)
            if got is None:
                abort = self._abort_text(
                    "timeout", h, f"host {h} did not report {tag!r} within {self.timeout_s} s "
                    f"to host {self.process_index} (is it running the same loader, created "
                    f"in the same order?)")
                break
            if got.startswith(_ABORT):
                abort = got  # that host failed before reporting: its own abort
                break
            values[h] = got
        decision = self._decide(client, f"{prefix}/decision", abort or _GO, tag)
        if decision != _GO:
            raise self._error(decision, tag)
        # "go": every host's value is in the store, even ones this host gave up on.
        for h in range(self.process_count):
            if h not in values:
                got = _compat.kv_wait(client, f"{prefix}/{h}", 1000 * max(self.timeout_s, 1))
                if got is None or got.startswith(_ABORT):
                    raise RuntimeError(f"JaxLoader: host {h}'s value for {tag!r} is missing "
                                       "although every host's was seen (key-value store lost it).")
                values[h] = got
        return [values[h] for h in range(self.process_count)]

    def fail(self, tag: str, error: BaseException) -> None:
        """Publishes that this host failed before reporting ``tag`` (best effort):
        the other hosts' exchange of ``tag`` then raises at once, naming this host
        and ``error``, instead of timing out, and none of them acts on ``tag``."""
        if self.process_count == 1:
            return
        text = self._abort_text("failed", self.process_index,
                                f"{type(error).__name__}: {printable(str(error), 1000)}")
        try:
            client = self._client()
            prefix = f"{self._ns}/{tag}"
            client.key_value_set(f"{prefix}/{self.process_index}", text)
            _compat.kv_create(client, f"{prefix}/decision", text)
        except Exception:  # noqa: BLE001, S110 - best effort: the others then time out naming us
            pass

    def forget(self, tag: str) -> None:
        """Deletes this host's keys for ``tag`` (best effort: keys are tiny). Only
        for a tag every host has decided (a later tag was agreed by all)."""
        if self.process_count == 1:
            return
        try:
            client = self._client()
            client.key_value_delete(f"{self._ns}/{tag}/{self.process_index}")
            if self.process_index == 0:
                client.key_value_delete(f"{self._ns}/{tag}/decision")
        except Exception:  # noqa: BLE001, S110 - best effort: keys are tiny
            pass

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _abort_text(kind: str, host: int, message: str) -> str:
        return f"{_ABORT}\n{kind}\n{host}\n{message}"

    def _wait(self, client, key: str, deadline: float, stop: threading.Event | None) -> str | None:
        """The value of ``key``; None if not set before ``deadline``."""
        while True:
            # A server-side wait answers as soon as the key is set (a poll loop
            # overshoots by up to its sleep, once per exchange); waiting in slices
            # of _WAIT_S notices a stop request.
            t = time.monotonic()
            left = deadline - t
            got = _compat.kv_wait(client, key, 1000 * min(_WAIT_S, max(left, 0)))
            if got is not None:
                return got
            if stop is not None and stop.is_set():
                raise Stopped(key)
            if time.monotonic() > deadline:
                return None
            if time.monotonic() - t < _WAIT_S / 10:
                time.sleep(_WAIT_S / 10)  # the store answered at once without a value

    def _decide(self, client, key: str, proposal: str, tag: str) -> str:
        """The tag's decision: ``proposal`` if this host creates it first, else the
        one already there. Bounded by ``timeout_s`` (the store unreachable)."""
        deadline = time.monotonic() + self.timeout_s
        last = ""
        while True:
            try:
                if _compat.kv_create(client, key, proposal):
                    return proposal
                got = _compat.kv_wait(client, key, 1000 * max(self.timeout_s, 1))
                if got is not None:
                    return got
            except Exception as e:  # noqa: BLE001 - retried until the deadline, then named
                last = printable(str(e), 200)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"JaxLoader: host {self.process_index} could not record the hosts' "
                    f"decision for {tag!r} within {self.timeout_s} s: the jax.distributed "
                    f"key-value store (the coordinator, on process 0) did not answer "
                    f"({last or 'no answer'}); has process 0 exited?")
            time.sleep(_WAIT_S)

    @staticmethod
    def _error(decision: str, tag: str) -> BaseException:
        parts = decision.split("\n", 3)
        kind, host, message = (parts[1], parts[2], parts[3]) if len(parts) == 4 else (
            "failed", "?", printable(decision, 300))
        if kind == "timeout":
            return TimeoutError(f"JaxLoader: {message}; no host takes the steps of {tag!r}.")
        return RuntimeError(
            f"JaxLoader: host {host} failed before reporting {tag!r} ({message}); "
            f"every host stops before these steps.")
