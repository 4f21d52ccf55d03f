"""One host of a 2-host run for the close-while-waiting test.

Host 0 starts a loader whose first step needs host 1's status (a Dataset whose
row count is unknown); host 1 never creates one, so host 0's exchange waits.
Host 0 then calls ``close()`` from the main thread and reports how long it took.
argv[1]: JSON {"coordinator", "process_id", "address" (Ray GCS), "out"}.
"""

import json
import sys
import threading
import time

from tests._harness import configure_process_env

configure_process_env()

import jax


def main():
    cfg = json.loads(sys.argv[1])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(cfg["coordinator"], num_processes=2, process_id=cfg["process_id"])
    from jax._src import distributed  # the test's own rendezvous, not the loader's

    client = distributed.global_state.client
    if jax.process_index() == 1:
        client.blocking_key_value_get("test/close/done", 540_000)  # generous: a loaded machine
        jax.distributed.shutdown()
        return
    import ray

    from slicefeed.pipelines import JaxLoader

    ray.init(address=cfg["address"], log_to_driver=False, configure_logging=False)
    ds = ray.data.range(64).map_batches(lambda b: b, batch_format="pyarrow")
    loader = JaxLoader(ds, global_batch_size=16, dtypes={"id": "int32"}, sync_timeout_s=20,
                       host_local=True)
    result = {}

    def consume():
        try:
            next(loader)
            result["next"] = "batch"
        except StopIteration:
            result["next"] = "StopIteration"
        except Exception as e:  # noqa: BLE001 - reported
            result["next"] = repr(e)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    # Close once the producer waits in the exchange of step 0 (its report is in
    # the store), not while it still reads (a Ray read is not interruptible).
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not [
            k for k, _ in client.key_value_dir_get("slicefeed/jaxloader/") if "/e0/s0/" in k]:
        time.sleep(0.05)
    time.sleep(0.5)  # inside its wait
    t0 = time.monotonic()
    loader.close()
    result["close_s"] = time.monotonic() - t0
    t.join(5)
    result["consumer_returned"] = not t.is_alive()

    def loader_threads():
        return [th.name for th in threading.enumerate() if th.name.startswith("slicefeed-jaxloader")]

    # close() waits at most about half a second for the thread; on a loaded machine
    # the store's answer to the current wait slice may take longer. Uninterrupted,
    # the thread would live until the exchange's timeout (20 s after it began).
    while loader_threads() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    result["threads_left"] = loader_threads()
    with open(cfg["out"], "w") as f:
        json.dump(result, f)
    client.key_value_set("test/close/done", "1")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
