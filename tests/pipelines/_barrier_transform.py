"""A test-only transform that makes two pipeline runs wait for each other.

``test_barrier`` passes batches through unchanged. The first call of each
Ray job (one driver = one run) creates ``<dir>/ready-<job id>`` and waits (up
to 180 s) until ``parties`` such files exist: every run is then past its start
checks and executing before any can commit. Only that one task per run
waits, so two runs fit on two CPUs. The spec is the same for every run
(identity comes from the Ray job), so their fingerprints can be equal.
Importing this module registers the transform.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import ClassVar

import pyarrow as pa
import ray
import ray.cloudpickle

from slicefeed.transforms import Transform

# Ray workers cannot import this tests folder: ship the class by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclasses.dataclass(frozen=True)
class Barrier(Transform):
    name: ClassVar[str] = "test_barrier"
    dir: str = ""
    parties: int = 2

    def __call__(self, table: pa.Table) -> pa.Table:
        if not self.dir:
            return table
        job = ray.get_runtime_context().get_job_id()
        try:
            fd = os.open(os.path.join(self.dir, f"ready-{job}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return table  # this run's waiting task is elsewhere
        os.close(fd)
        deadline = time.monotonic() + 180
        while len([n for n in os.listdir(self.dir) if n.startswith("ready-")]) < self.parties:
            if time.monotonic() > deadline:
                raise TimeoutError("the other run never started writing")
            time.sleep(0.05)
        return table
