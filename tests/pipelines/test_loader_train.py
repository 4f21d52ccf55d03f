"""Ray Train v2 JaxTrainer with 2 CPU workers feeding a jitted step via JaxLoader."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.pipelines._data import make_table

# Ray Train v2 is chosen when ray.train is imported.
os.environ["RAY_TRAIN_V2_ENABLED"] = "1"

pytest.importorskip("pydantic", reason="Ray Train needs ray[train] (the 'train' extra)")


def _train_fn(config):
    import jax
    import jax.numpy as jnp
    import ray.train

    from slicefeed.pipelines import JaxLoader

    loader = JaxLoader(
        ray.train.get_dataset_shard("train"),
        global_batch_size=16,
        remainder="pad",
        num_epochs=2,
        dtypes={"id": "int32"},
    )

    @jax.jit
    def step(batch):
        return jnp.sum(jnp.where(batch["mask"], batch["id"], 0)), jnp.sum(batch["mask"])

    sums = []
    for batch in loader:
        assert batch["id"].shape == (16,) and batch["x"].shape == (16, 4)
        total, rows = step(batch)
        sums.append([int(total), int(rows)])
    out = {
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "sums": sums,
        "stats": loader.stats(),
        "traces": step._cache_size(),
    }
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


@pytest.mark.slow
def test_jax_trainer_two_workers(ray_cluster, tmp_path):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxConfig, JaxTrainer

    # Workers cannot import this test module: ship _train_fn by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    n = 90
    ds = ray.data.from_arrow(make_table(0, n))
    out = tmp_path / "out"
    out.mkdir()
    trainer = JaxTrainer(
        _train_fn,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        datasets={"train": ds},
        # Ray's JAX backend calls jax.distributed.initialize only when use_tpu or
        # use_gpu is set; on this CPU-only machine JaxConfig(use_gpu=True) (without
        # GPU resources in ScalingConfig) plus JAX_PLATFORMS=cpu makes it initialize
        # on CPU: 2 processes x 4 devices = one 8-device mesh, gloo collectives.
        jax_config=JaxConfig(use_gpu=True),
        run_config=RunConfig(
            storage_path=str(tmp_path / "runs"),
            worker_runtime_env={
                "env_vars": {
                    "JAX_PLATFORMS": "cpu",
                    "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                }
            },
        ),
    )
    trainer.fit()
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in reports:
        assert r["process_count"] == 2 and r["device_count"] == 8
        assert r["traces"] == 1  # one compilation for every step
    assert reports[0]["sums"] == reports[1]["sums"]  # same steps, same global results
    sums = reports[0]["sums"]
    # every row once per epoch: global sum of ids and of real rows over both epochs
    assert sum(s[0] for s in sums) == 2 * sum(range(n))
    assert sum(s[1] for s in sums) == 2 * n
    assert sum(r["stats"]["rows"] for r in reports) == 2 * n
