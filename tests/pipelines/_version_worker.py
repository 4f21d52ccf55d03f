"""One host of a 2-host job whose committed dataset gets a new version while
the hosts open it: jax.distributed (gloo) + JaxLoader over a URI, no Ray.

argv[1]: JSON {"coordinator", "process_id", "uri", "dir"}. Host 0 writes
``<dir>/opening`` and opens the dataset at once; host 1 waits for
``<dir>/committed`` (the test commits the new version between the two) before
it opens it. Writes ``<dir>/host<h>.json``: the version read, the steps, and
the ids this host delivered.
"""

import json
import os
import sys
import time

from tests._harness import configure_process_env

configure_process_env()

import jax


def main():
    cfg = json.loads(sys.argv[1])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(cfg["coordinator"], num_processes=2, process_id=cfg["process_id"])
    import numpy as np

    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._multihost_worker import local_rows

    h = jax.process_index()
    if h == 0:
        open(os.path.join(cfg["dir"], "opening"), "w").close()
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(cfg["dir"], "committed")):
            assert time.monotonic() < deadline, "the new version was never committed"
            time.sleep(0.05)
    loader = JaxLoader(cfg["uri"], global_batch_size=4, sync_timeout_s=120)
    ids = [np.asarray(local_rows(b["id"])).tolist() for b in loader]
    report = {"version": loader.state_dict()["plan"]["dataset_version"], "steps": len(ids),
              "ids": [i for batch in ids for i in batch]}
    with open(os.path.join(cfg["dir"], f"host{h}.json"), "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
