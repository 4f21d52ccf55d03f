"""Progress of a batch run in rows, named after the spec's transforms.

A driver thread polls the run's stage counters (the same counts the report
is built from) and prints one line per update::

    text-lm: 12,000 rows read | tokenize 12,000 | pack_sequences 12,000 -> 1,104 | written 1,104 | 6.0 s

On a terminal the line is redrawn in place; in a non-interactive log (a
file, a pipe, Kubernetes pod logs) each update is a new line, every
``interval`` seconds (default 10 s there, 1 s on a terminal), plus a last
line when the run ends.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Self, TextIO

if TYPE_CHECKING:  # pragma: no cover
    from slicefeed.pipelines._pipeline import StageCounts


def progress_line(name: str, counts: StageCounts, elapsed: float) -> str:
    """One progress line from a run's stage counters."""
    parts = [f"{name}: {counts.rows_read:,} rows read"]
    for t in counts.transform_rows():
        if t["rows_out"] != t["rows_in"]:
            parts.append(f"{t['name']} {t['rows_in']:,} -> {t['rows_out']:,}")
        else:
            parts.append(f"{t['name']} {t['rows_in']:,}")
    parts.append(f"written {counts.rows_out:,}")
    parts.append(f"{elapsed:.1f} s")
    return " | ".join(parts)


class Progress:
    """Prints ``progress_line`` for ``poll()`` every ``interval`` seconds until ``stop()``.

    Args:
        name: Pipeline name (line prefix).
        poll: Returns the current counters; errors are ignored (progress is
            informative only).
        stream: Where to print (default: stderr).
        interval: Seconds between updates (default 1 on a terminal, 10 otherwise).
    """

    def __init__(self, name: str, poll: Callable[[], StageCounts], *,
                 stream: TextIO | None = None, interval: float | None = None):
        self.name = name
        self.poll = poll
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.tty = bool(isatty())
        self.interval = float(interval if interval is not None else (1.0 if self.tty else 10.0))
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="slicefeed-progress", daemon=True)
        self._last = ""

    def __enter__(self) -> Self:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(final=exc[0] is None)

    def _emit(self) -> None:
        try:
            counts = self.poll()
        except Exception:  # noqa: BLE001 - informative only
            return
        line = progress_line(self.name, counts, time.perf_counter() - self._t0)
        if self.tty:
            pad = max(0, len(self._last) - len(line))
            self.stream.write("\r" + line + " " * pad)
        else:
            self.stream.write(line + "\n")
        self._last = line
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._emit()

    def stop(self, *, final: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if final:
            self._emit()
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
