"""A test-only transform that stalls once, so a test can kill a process mid-job.

``test_stall`` passes its batches through unchanged. The first batch holding
rows of a file whose name contains ``match`` makes it write its process id
to ``marker`` (atomically) and sleep ``seconds``; once ``marker`` exists it
never stalls again, so a rerun (or Ray's retry of the killed task) runs
straight through. Importing this module registers the transform.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import ray.cloudpickle

from slicefeed.connectors import PROVENANCE_FILE
from slicefeed.transforms import Transform

# Ray workers cannot import this tests folder: ship the class by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclasses.dataclass(frozen=True)
class Stall(Transform):
    name: ClassVar[str] = "test_stall"
    marker: str = ""
    match: str = ""
    seconds: float = 0.0

    def __call__(self, table: pa.Table) -> pa.Table:
        if (
            self.seconds
            and self.marker
            and not os.path.exists(self.marker)
            and PROVENANCE_FILE in table.column_names
            and any(self.match in f for f in pc.unique(table[PROVENANCE_FILE]).to_pylist())
        ):
            tmp = f"{self.marker}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(str(os.getpid()))
            os.replace(tmp, self.marker)
            time.sleep(self.seconds)
        return table


@dataclasses.dataclass(frozen=True)
class Gate(Transform):
    """Holds back the files whose name contains one of ``match`` until
    ``<folder>/released`` exists; the first held batch writes ``<folder>/held``.

    Its only path argument is a folder that exists throughout, so the
    pipeline's fingerprint (which digests files named by transform arguments)
    is the same for the held run and its rerun.
    """

    name: ClassVar[str] = "test_gate"
    folder: str = ""
    match: tuple[str, ...] = ()
    seconds: float = 0.0

    def __call__(self, table: pa.Table) -> pa.Table:
        marker = os.path.join(self.folder, "held")
        release = os.path.join(self.folder, "released")
        if PROVENANCE_FILE not in table.column_names or os.path.exists(release):
            return table
        files = pc.unique(table[PROVENANCE_FILE]).to_pylist()
        if any(m in f for f in files for m in self.match):
            if not os.path.exists(marker):
                tmp = f"{marker}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(str(os.getpid()))
                os.replace(tmp, marker)
            deadline = time.monotonic() + self.seconds
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.2)
        return table
