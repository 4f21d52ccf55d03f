"""One host of a 2-host run: a slicefeed Pipeline source is split per host by its
input files; a shared ray.data.Dataset is refused.

argv[1]: JSON {"coordinator", "process_id", "address" (Ray GCS), "raw" (JSONL dir),
"out"}. Writes {"steps", "epochs": {epoch: [ids]}, "dataset_error"} to ``out``.
"""

import json
import os
import sys

from tests._harness import configure_process_env

configure_process_env()

import jax
import numpy as np

from tests.pipelines._multihost_worker import local_rows


def main():
    cfg = json.loads(sys.argv[1])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(cfg["coordinator"], num_processes=2, process_id=cfg["process_id"])
    import ray

    from slicefeed.pipelines import JaxLoader, Pipeline

    ray.init(address=cfg["address"], log_to_driver=False, configure_logging=False)
    spec = {
        "name": "split",
        "source": {"format": "jsonl", "uri": cfg["raw"]},
        "transforms": [
            {"cast": {"columns": {"id": "int32"}}},
            {"select": {"columns": ["id"]}},
        ],
        "sink": {"format": "parquet", "uri": os.path.join(cfg["raw"], "..", "out")},
    }
    report = {"epochs": {}}
    loader = JaxLoader(Pipeline(spec), global_batch_size=16, remainder="pad", num_epochs=2)
    steps = 0
    for batch in loader:
        sd = loader.state_dict()
        e = sd["epoch"] if sd["step"] > 0 else sd["epoch"] - 1
        ids = local_rows(batch["id"])[local_rows(batch["mask"])]
        report["epochs"].setdefault(str(e), []).extend(np.asarray(ids).tolist())
        steps += 1
    report["steps"] = steps
    try:
        JaxLoader(ray.data.range(64), global_batch_size=16, dtypes={"id": "int32"})
        report["dataset_error"] = None
    except Exception as e:  # noqa: BLE001 - reported
        report["dataset_error"] = f"{type(e).__name__}: {e}"
    with open(cfg["out"], "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
