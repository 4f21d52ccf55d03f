"""One host of an elastic-resume run: jax.distributed (gloo) + JaxLoader over a
committed dataset, no Ray (a URI read with reader="local" needs none).

argv[1]: JSON {"coordinator", "process_id", "num_processes", "uri", "phase"
("before" or "after"), "cases": {name: {...}}, "dir"}. Every case is run in
order on every host (loaders are created in the same order everywhere):

- ``before``: takes ``case["steps"]`` steps, writes ``<dir>/<name>.state.<host>.json``;
- ``after``: resumes from host 0's saved state and reads to the end.

Writes ``<dir>/<phase>.<num_processes>.<host>.json``: per case, the ids this host delivered per
epoch, its batch count, stats, or the error (``"Type: message"``) it raised.
"""

import json
import os
import sys

from tests._harness import configure_process_env

configure_process_env()

import jax


def main():
    cfg = json.loads(sys.argv[1])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        cfg["coordinator"], num_processes=cfg["num_processes"], process_id=cfg["process_id"]
    )
    import numpy as np

    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._multihost_worker import local_rows

    h = jax.process_index()
    report = {}
    for name, case in cfg["cases"].items():
        kw = case["kwargs"]
        try:
            if cfg["phase"] == "before":
                loader = JaxLoader(cfg["uri"], **kw)
                limit = case["steps"]
            else:
                with open(os.path.join(cfg["dir"], f"{name}.state.0.json")) as f:
                    state = json.load(f)
                loader = JaxLoader(cfg["uri"], state=state, **kw)
                limit = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            report[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        epochs, batches = {}, 0
        for batch in loader:
            sd = loader.state_dict()
            ids = local_rows(batch["id"])
            if "mask" in batch:
                ids = ids[local_rows(batch["mask"])]
            e = sd["epoch"] if sd["step"] > 0 else sd["epoch"] - 1
            epochs.setdefault(str(e), []).extend(np.asarray(ids).tolist())
            batches += 1
            if limit is not None and batches >= limit:
                break
        if cfg["phase"] == "before":
            with open(os.path.join(cfg["dir"], f"{name}.state.{h}.json"), "w") as f:
                json.dump(loader.state_dict(), f)
        report[name] = {"epochs": epochs, "batches": batches, "stats": loader.stats(),
                        "steps_per_epoch": loader.steps_per_epoch}
        loader.close()
    with open(os.path.join(cfg["dir"], f"{cfg['phase']}.{cfg['num_processes']}.{h}.json"), "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
