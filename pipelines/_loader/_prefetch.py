"""Prefetch: runs the production of device batches ahead of the consumer.

The producer thread holds only what producing needs (never the loader), so a
loader dropped without ``close()`` is collected; its ``weakref.finalize`` then
stops the thread and releases the queued device batches. ``depth`` device
batches at most exist here at any time: a slot is taken before a batch is
produced and given back when the consumer takes it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

_POLL_S = 0.05
_JOIN_S = 0.5


class Runtime:
    """Batches from ``make_items()`` in order: in the consumer's thread (``depth=0``)
    or in one background thread holding at most ``depth`` produced items."""

    def __init__(self, make_items: Callable[[], Iterator], depth: int, stop: threading.Event):
        self._make_items = make_items
        self.depth = int(depth)
        self.stop = stop
        self._gen: Iterator | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.Semaphore(max(self.depth, 1))

    def next_item(self):
        """The next item; ``StopIteration`` at the end; re-raises a producer error."""
        if self.depth == 0:
            if self._gen is None:
                self._gen = self._make_items()
            return next(self._gen)
        if self._thread is None:
            self._thread = threading.Thread(
                target=_run,
                args=(self._make_items, self._queue, self._slots, self.stop),
                name="slicefeed-jaxloader",
                daemon=True,
            )
            self._thread.start()
        while True:
            try:
                kind, item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if self.stop.is_set():  # closed while waiting
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError(
                        "JaxLoader: the prefetch thread ended without a result."
                    ) from None
        self._slots.release()
        if kind == "end":
            raise StopIteration
        if kind == "error":
            raise item  # keeps the producer's traceback (item.__traceback__)
        return item

    def close(self) -> None:
        """Stops production and drops every queued batch; returns within about
        ``_JOIN_S`` even when the producer is blocked in a read."""
        self.stop.set()
        if self._gen is not None:
            gen, self._gen = self._gen, None
            try:
                gen.close()
            except Exception:  # noqa: BLE001, S110 - closing: nothing left to report to
                pass
        _drain(self._queue)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(_JOIN_S)
            _drain(self._queue)


def _drain(q: queue.SimpleQueue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _run(make_items, q: queue.SimpleQueue, slots: threading.Semaphore, stop: threading.Event):
    gen = None
    try:
        gen = make_items()
        while not stop.is_set():
            if not slots.acquire(timeout=_POLL_S):
                continue
            try:
                item = next(gen)
            except StopIteration:
                q.put(("end", None))
                return
            if stop.is_set():
                return
            q.put(("batch", item))
    except BaseException as e:  # noqa: BLE001 - surfaced in the consumer
        if not stop.is_set():
            q.put(("error", e))
    finally:
        if gen is not None:
            try:
                gen.close()  # stops the source's readers
            except Exception:  # noqa: BLE001, S110 - closing: nothing left to report to
                pass
        if stop.is_set():
            _drain(q)
