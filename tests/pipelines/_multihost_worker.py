"""One simulated host of a 2-host slice: jax.distributed (gloo) + JaxLoader.

argv[1]: JSON {"coordinator", "process_id", "num_processes", "address" (Ray GCS),
"uri" (committed dataset), "sizes" (rows of each host's own Dataset), "long_sizes"
(the same for the "long" cases: many steps of unknown row count), "out"}.
Writes a JSON report to ``out``: for each case, per epoch, the ids this host
delivered (mask applied), steps, stats, and the jitted global sums; then, to
``out + ".error.json"``, the steps and error of a loader whose source fails on host 0
("fail"), of one whose conversion fails on host 1 ("convert") and of one that host 1
creates only after host 0 gave up waiting ("late").
"""

import faulthandler
import json
import sys
import time
from pathlib import Path

from tests._harness import configure_process_env

configure_process_env()

import jax
import numpy as np


def local_rows(arr):
    """This host's rows of a global batch array, in global order."""
    shards = sorted(arr.addressable_shards, key=lambda s: s.index[0].start or 0)
    seen, out = set(), []
    for s in shards:
        start = s.index[0].start or 0
        if start not in seen:
            seen.add(start)
            out.append(np.asarray(s.data))
    return np.concatenate(out)


def main():
    cfg = json.loads(sys.argv[1])
    # Where a hang is: every thread's stack in the output the test shows on timeout.
    faulthandler.dump_traceback_later(540, exit=False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        cfg["coordinator"], num_processes=cfg["num_processes"], process_id=cfg["process_id"]
    )
    import jax.numpy as jnp
    import ray

    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._data import make_table

    assert jax.device_count() == 8 and jax.local_device_count() == 4
    ray.init(address=cfg["address"], log_to_driver=False, configure_logging=False)
    h = jax.process_index()
    sizes = cfg["sizes"]
    start = sum(sizes[:h])
    own = ray.data.from_arrow(make_table(start, sizes[h]))
    long_sizes = cfg["long_sizes"]
    long = ray.data.from_arrow(make_table(sum(long_sizes[:h]), long_sizes[h]))

    @jax.jit
    def step(batch):
        w = batch["mask"] if "mask" in batch else jnp.ones_like(batch["id"], dtype=bool)
        return jnp.sum(jnp.where(w, batch["id"], 0)), jnp.sum(w)

    cases = {
        "uri-pad": (cfg["uri"], "pad"),
        "uri-drop": (cfg["uri"], "drop"),
        "known-pad": (own, "pad"),
        "known-drop": (own, "drop"),
        "unknown-pad": (own.map_batches(lambda b: b, batch_format="pyarrow"), "pad"),
        "unknown-drop": (own.map_batches(lambda b: b, batch_format="pyarrow"), "drop"),
        "long-pad": (long.map_batches(lambda b: b, batch_format="pyarrow"), "pad"),
        "long-drop": (long.map_batches(lambda b: b, batch_format="pyarrow"), "drop"),
    }
    report = {}
    for name, (src, remainder) in cases.items():
        # Each host's Dataset holds its own rows (a URI is split by the loader).
        own_rows = not isinstance(src, str)
        loader = JaxLoader(src, global_batch_size=16, remainder=remainder, num_epochs=2,
                           host_local=own_rows)
        epochs = {}
        sums = []
        for batch in loader:
            sd = loader.state_dict()
            ids = local_rows(batch["id"])
            if "mask" in batch:
                ids = ids[local_rows(batch["mask"])]
            total, rows = step(batch)
            sums.append([int(total), int(rows)])
            # state points at the next batch; the batch just received is one before it
            e = sd["epoch"] if sd["step"] > 0 else sd["epoch"] - 1
            epochs.setdefault(str(e), []).append(ids.tolist())
        report[name] = {
            "steps_per_epoch": loader.steps_per_epoch,
            "epochs": epochs,
            "sums": sums,
            "stats": loader.stats(),
        }
    with open(cfg["out"], "w") as f:
        json.dump(report, f)

    # A mesh of the caller's: the batch axis must give each host its own rows.
    # One whose batch axis lies within each host (or is not sharded) failed at
    # the first batch with JAX's "Invalid host data" instead of a named error.
    from jax.sharding import Mesh, PartitionSpec

    grid = np.array(jax.devices())  # host 0's devices, then host 1's
    meshes = {
        "across": (Mesh(grid.reshape(2, 4), ("data", "model")), PartitionSpec("data")),
        "within": (Mesh(grid.reshape(4, 2), ("model", "data")), PartitionSpec("data")),
        "unsharded": (Mesh(grid.reshape(2, 4), ("data", "model")), PartitionSpec(None, "data")),
    }
    layouts = {}
    for name, (mesh, spec) in meshes.items():
        try:
            loader = JaxLoader(cfg["uri"], global_batch_size=16, mesh=mesh, partition_spec=spec)
            layouts[name] = {"rows": local_rows(next(loader)["id"]).tolist()}
            loader.close()
        except Exception as e:  # noqa: BLE001 - reported
            layouts[name] = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
    Path(cfg["out"] + ".mesh.json").write_text(json.dumps(layouts))

    # A read error on host 0 (past its first groups of steps): host 0 raises it and
    # publishes it before its next exchange; host 1's exchange raises naming host 0
    # and its error; both took the same steps. The timeout is generous (a loaded
    # machine): nothing here waits for it unless a host fails to publish.
    first_bad = sum(long_sizes[:1]) // 2

    def fail_on_host0(b):
        if h == 0 and max(b["id"].to_pylist()) >= first_bad:
            raise ValueError(f"bad row {first_bad} (test)")
        return b

    lo = sum(long_sizes[:h])
    blocks = ray.data.from_arrow([make_table(i, min(32, lo + long_sizes[h] - i))
                                  for i in range(lo, lo + long_sizes[h], 32)])
    errors = {}

    def run_until_error(name, make_loader):
        steps, error = 0, None
        try:
            loader = make_loader()
            for batch in loader:
                total, _ = step(batch)
                int(total)  # a collective every host must join: blocks if one does not
                steps += 1
        except Exception as e:  # noqa: BLE001 - reported
            error = f"{type(e).__name__}: {str(e)[:3000]}"
        errors[name] = {"steps": steps, "error": error}
        tmp = Path(cfg["out"] + ".error.json.tmp")
        tmp.write_text(json.dumps(errors))
        tmp.replace(cfg["out"] + ".error.json")  # whole, for the other host to read

    # Ray may run the failing block already while the loader reads the schema (host
    # 0 then fails before any exchange and host 1 times out naming it).
    run_until_error("fail", lambda: JaxLoader(
        blocks.map_batches(fail_on_host0, batch_size=32, batch_format="pyarrow"),
        global_batch_size=16, remainder="pad", host_local=True, sync_timeout_s=60))

    # A conversion error on host 1 only (ids past int8 lie in its share of the
    # committed dataset, whose steps every host knows up front): both hosts end
    # after the same steps, host 0 naming host 1 and its error.
    run_until_error("convert", lambda: JaxLoader(
        cfg["uri"], global_batch_size=16, dtypes={"id": "int8"}, remainder="pad",
        sync_timeout_s=60))

    # A late host: host 1 creates its loader only once host 0 has given up waiting
    # for it. Host 0's report of the first step is still in the store; host 1 must
    # not take that step (and its collective) alone.
    late = blocks.map_batches(lambda b: b, batch_size=32, batch_format="pyarrow")
    other = Path(cfg["out"]).with_name("host0.json.error.json")  # see the test's names
    deadline = time.monotonic() + 300
    while h == 1 and time.monotonic() < deadline and (
            not other.exists() or "late" not in json.loads(other.read_text())):
        time.sleep(0.05)
    run_until_error("late", lambda: JaxLoader(
        late, global_batch_size=16, remainder="pad", host_local=True, sync_timeout_s=2))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
