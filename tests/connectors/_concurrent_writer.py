"""A writer process for the concurrent-commit tests.

    python _concurrent_writer.py URI ME OTHER BARRIER_DIR ROWS OUT_JSON

Writes ROWS rows (values offset by ME so the two writers' data differ) with
``write_parquet``; its first batch waits until the OTHER process has
started writing too, so both are past their start checks and writing shards
when either commits. Joins the Ray cluster at ``RAY_ADDRESS`` if set (the test
session's), else starts a local one. Records the outcome in OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests._harness import configure_process_env

configure_process_env()

import ray

from slicefeed import connectors
from slicefeed.connectors import write_parquet

# Named by the commit protocol; absent from older slicefeed versions, whose
# both writers "commit" (the failure the test shows).
CommitConflictError = getattr(connectors, "CommitConflictError", type("_Never", (Exception,), {}))


def main() -> None:
    uri, me, other, barrier, rows, out = sys.argv[1:7]
    rows_n = int(rows)
    offset = 1000 * int(me)

    def gate(batch):
        # Only this writer's first task waits (the others pass), so the two
        # writers fit on a 2-CPU cluster together.
        try:
            os.close(os.open(os.path.join(barrier, f"ready-{me}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return {"i": batch["id"] + offset}
        deadline = time.monotonic() + 180
        while not os.path.exists(os.path.join(barrier, f"ready-{other}")):
            if time.monotonic() > deadline:
                raise TimeoutError("the other writer never started")
            time.sleep(0.05)
        return {"i": batch["id"] + offset}

    if os.environ.get("RAY_ADDRESS"):  # the test session's cluster: a second driver on it
        ray.init(log_to_driver=False, configure_logging=False)
    else:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    ds = ray.data.range(rows_n, override_num_blocks=4).map_batches(gate, batch_size=None)
    try:
        m = write_parquet(ds, uri, fingerprint=f"writer-{me}")
        result = {"status": "committed", "version": getattr(m, "version", None), "files": [f.path for f in m.files],
                  "writer": getattr(m, "writer", "")}
    except CommitConflictError as e:
        result = {"status": "conflict", "version": e.version, "error": str(e)}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
