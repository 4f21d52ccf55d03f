"""Driver for the end-to-end slice test: pipeline -> JaxTrainer on a simulated v6e 4x4.

Run as a subprocess against the simulated cluster (``RAY_ADDRESS`` set):

    python _slice_train_driver.py OUT_DIR SOURCE_URI

1. Builds the dataset with a slicefeed pipeline (jsonl on the GCS emulator ->
   cast/select transforms -> lazy ``ray.data.Dataset``).
2. Fit 1 (uninterrupted): ``JaxTrainer`` with ``SliceSpec("4x4", "v6e")``'s
   ScalingConfig; every worker feeds a jitted train step from
   ``JaxLoader(get_dataset_shard("train"), ...)`` and records, per step, the
   ids of its real (unmasked) rows; after ``CKPT_STEP`` steps it reports a
   Ray Train checkpoint holding ``loader.state_dict()`` and keeps going.
3. Fit 2 (resumed): a new ``fit()`` whose workers restore the loader from that
   checkpoint and run to the end of the epoch.

Each worker writes ``OUT_DIR/<run>-rank<r>.json``; the test compares them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

GLOBAL_BATCH = 64
CKPT_STEP = 5


def train_loop(config: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import ray.train
    from ray.train import Checkpoint

    from slicefeed.pipelines import JaxLoader, SliceSpec

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    state = None
    if config.get("resume"):
        with open(os.path.join(config["resume"], f"loader-rank{rank}.json")) as f:
            state = json.load(f)

    # The slice's batch-size rule, checked against the real device count.
    SliceSpec("4x4", "v6e").validate_global_batch_size(GLOBAL_BATCH, devices=jax.device_count())
    loader = JaxLoader(
        ray.train.get_dataset_shard("train"),
        global_batch_size=GLOBAL_BATCH,
        remainder="pad",
        num_epochs=1,
        # JSON numbers are int64 / float64; JAX without x64 needs them cast.
        dtypes={"id": "int32", "x": "float32", "y": "float32"},
        state=state,
        sync_timeout_s=120,
    )

    @jax.jit
    def train_step(w, batch):
        def loss_fn(w):
            pred = batch["x"] * w
            err = jnp.where(batch["mask"], pred - batch["y"], 0.0)
            return jnp.sum(err * err) / jnp.maximum(jnp.sum(batch["mask"]), 1)

        loss, g = jax.value_and_grad(loss_fn)(w)
        return w - 0.01 * g, loss

    # The weight goes back to the host after every step, so every call of the
    # step sees the same input types and shardings (a batch's are the loader's).
    w = np.float32(0.0)
    steps = []
    start = loader.state_dict()["step"]
    for i, batch in enumerate(loader):
        step = start + i
        ids = batch["id"]
        # Local rows of this host: its addressable shards, in device order.
        local = np.concatenate([np.asarray(s.data) for s in ids.addressable_shards])
        mask = np.concatenate([np.asarray(s.data) for s in batch["mask"].addressable_shards])
        w, loss = train_step(w, batch)
        w = np.asarray(w.addressable_data(0))
        steps.append(
            {
                "step": step,
                "ids": local[mask].tolist(),
                "padded": int((~mask).sum()),
                "shape": list(ids.shape),
                "devices": len(ids.sharding.device_set),
                "local_shards": len(ids.addressable_shards),
                "loss": float(loss),
            }
        )
        if config.get("checkpoint_at") == step + 1:
            with tempfile.TemporaryDirectory() as d:
                # Every host's state (they must agree; the test checks).
                with open(os.path.join(d, f"loader-rank{rank}.json"), "w") as f:
                    json.dump(loader.state_dict(), f)
                ray.train.report({"step": step + 1}, checkpoint=Checkpoint.from_directory(d))
    loader.close()
    record = {
        "rank": rank,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "steps_per_epoch": loader.stats()["steps_per_epoch"],
        "rows": loader.stats()["rows"],
        # Compilations of the step: one for every batch (same shapes and shardings).
        "traces": train_step._cache_size(),
        "steps": steps,
    }
    with open(os.path.join(config["out"], f"{config['run']}-rank{rank}.json"), "w") as f:
        json.dump(record, f)


def main(out_dir: str, source_uri: str) -> None:
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    import ray
    from ray.data import ExecutionOptions
    from ray.train import DataConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer
    from ray.util.placement_group import placement_group

    from slicefeed.pipelines import Pipeline, SliceSpec

    ray.init(log_to_driver=False, logging_level="ERROR")

    # The fixture's incomplete slice-b has a worker 0 and so a head resource:
    # a trainer that reserved it would wait forever for host 3 (what
    # `slicefeed slices` flags). Hold that head so only slice-a can be chosen.
    hold_b = placement_group(
        [{"TPU-v6e-16-head": 1}], bundle_label_selector=[{"ray.io/tpu-slice-name": "slice-b"}]
    )
    ray.get(hold_b.ready(), timeout=60)

    pipeline = Pipeline(
        {
            "name": "slice-e2e",
            "source": {"format": "jsonl", "uri": source_uri},
            "transforms": [
                {"cast": {"columns": {"id": "int32", "x": "float32", "y": "float32"}}},
                {"select": {"columns": ["id", "x", "y"]}},
            ],
        }
    )
    spec = SliceSpec("4x4", "v6e")
    common = {
        "scaling_config": ScalingConfig(**spec.scaling_config_kwargs()),
        # preserve_order: Ray Data then splits blocks to workers deterministically
        # (no locality-driven dispatch), so a resumed run sees the same shards.
        "dataset_config": DataConfig(execution_options=ExecutionOptions(preserve_order=True)),
    }
    storage = os.path.join(out_dir, "ray-results")
    env = {
        "env_vars": {
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        }
    }
    timings = {}
    t = time.monotonic()
    result = JaxTrainer(
        train_loop,
        train_loop_config={"out": out_dir, "run": "full", "checkpoint_at": CKPT_STEP},
        datasets={"train": pipeline.dataset()},
        run_config=RunConfig(name="full", storage_path=storage, worker_runtime_env=env),
        **common,
    ).fit()
    timings["fit_full_s"] = time.monotonic() - t
    assert result.error is None, result.error
    ckpt = result.checkpoint
    assert ckpt is not None, "fit 1 reported no checkpoint"

    t = time.monotonic()
    result2 = JaxTrainer(
        train_loop,
        train_loop_config={"out": out_dir, "run": "resumed", "resume": ckpt.path},
        datasets={"train": pipeline.dataset()},
        run_config=RunConfig(name="resumed", storage_path=storage, worker_runtime_env=env),
        **common,
    ).fit()
    timings["fit_resumed_s"] = time.monotonic() - t
    assert result2.error is None, result2.error
    with open(os.path.join(out_dir, "driver.json"), "w") as f:
        json.dump({"checkpoint": ckpt.path, "checkpoint_files": sorted(os.listdir(ckpt.path)), **timings}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
