"""Test-only transforms that kill their worker process on one input file, every time.

``test_crash`` passes batches through, except a batch holding rows of a file
whose name contains ``match``: it appends its process id to ``log`` (one
line per attempt) and ends the process with ``os._exit`` (as a segfault or
an out-of-memory kill would, without a Python exception). ``test_crash_dedup`` does
the same inside ``deduplicate``'s per-group work. Importing this module
registers both.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import ray.cloudpickle

from slicefeed.connectors import PROVENANCE_FILE
from slicefeed.transforms import Deduplicate, Transform

# Ray workers cannot import this tests folder: ship the class by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclasses.dataclass(frozen=True)
class Crash(Transform):
    name: ClassVar[str] = "test_crash"
    log: str = ""
    match: str = ""

    def __call__(self, table: pa.Table) -> pa.Table:
        if (
            self.match
            and PROVENANCE_FILE in table.column_names
            and any(self.match in f for f in pc.unique(table[PROVENANCE_FILE]).to_pylist())
        ):
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\n")
            os._exit(77)
        return table


@dataclasses.dataclass(frozen=True)
class CrashDedup(Deduplicate):
    """``deduplicate`` whose per-group work kills its worker on a group holding
    rows of a file whose name contains ``match`` (as an out-of-memory kill on
    one huge group would); its dataset-level plan is the real one."""

    name: ClassVar[str] = "test_crash_dedup"
    log: str = ""
    match: str = ""

    def __call__(self, table: pa.Table) -> pa.Table:
        if (
            self.match
            and PROVENANCE_FILE in table.column_names
            and any(self.match in f for f in pc.unique(table[PROVENANCE_FILE]).to_pylist())
        ):
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\n")
            os._exit(77)
        return super().__call__(table)
