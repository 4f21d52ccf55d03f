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
