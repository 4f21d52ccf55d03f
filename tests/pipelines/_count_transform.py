"""A test-only transform that counts its calls: each call writes one file into ``dir``.

Importing this module registers ``test_count``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from typing import ClassVar

import pyarrow as pa
import ray.cloudpickle

from slicefeed.transforms import Transform

# Ray workers cannot import this tests folder: ship the class by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclasses.dataclass(frozen=True)
class Count(Transform):
    name: ClassVar[str] = "test_count"
    dir: str = ""

    def __call__(self, table: pa.Table) -> pa.Table:
        open(os.path.join(self.dir, uuid.uuid4().hex), "w").close()
        return table
