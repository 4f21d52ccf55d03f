"""Where preprocessing runs: CPU-only nodes vs TPU hosts, on the simulated cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from slicefeed.connectors import SpecError
from slicefeed.pipelines import apply_placement, placement_label_selector, preprocessing_placement

# Runs in a driver subprocess against the simulated cluster. Each map task
# records the node it ran on; the driver reports node ids with their labels.
_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import ray
    from slicefeed.pipelines import preprocessing_placement

    ray.init(log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False

    def record(batch):
        time.sleep(0.05)  # long enough for Ray Data to spread tasks over free CPUs
        node = ray.get_runtime_context().get_node_id()
        batch["node"] = np.array([node] * len(batch["id"]))
        return batch

    def run(ds):
        rows = ds.take_all()
        return {"ids": sorted(int(r["id"]) for r in rows), "nodes": sorted({r["node"] for r in rows})}

    out = {}
    for mode in ("cpu_only", "any"):
        ds = ray.data.range(96, override_num_blocks=24)
        out[mode] = run(ds.map_batches(record, batch_size=4, **preprocessing_placement(mode)))
    # The pipeline spec option: placement.preprocess_on applies to the whole
    # execution (read + transforms) through apply_placement on the Dataset's
    # context, so `record`, given no placement of its own, carries it too.
    from slicefeed.pipelines import Pipeline
    p = Pipeline({
        "name": "placement",
        "source": {"format": "jsonl", "uri": sys.argv[1]},
        "transforms": [{"cast": {"columns": {"id": "int64"}}}],
        "placement": {"preprocess_on": "cpu_only"},
    })
    out["pipeline_cpu_only"] = run(p.dataset().map_batches(record, batch_size=4))
    out["labels"] = {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slice
def test_map_tasks_stay_off_tpu_hosts(slice_cluster, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    src = tmp_path / "src"
    src.mkdir()
    for f in range(4):
        rows = [json.dumps({"id": i}) for i in range(f * 24, (f + 1) * 24)]
        (src / f"part-{f}.jsonl").write_text("\n".join(rows) + "\n")
    proc = subprocess.run(
        [sys.executable, str(script), str(src)],
        env=slice_cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    labels = out["labels"]
    tpu_hosts = {n for n, lb in labels.items() if lb.get("ray.io/accelerator-type", "").startswith("TPU-")}
    assert len(tpu_hosts) == 7  # 4 hosts of slice-a + 3 of slice-b
    for mode in ("cpu_only", "any", "pipeline_cpu_only"):
        assert out[mode]["ids"] == list(range(96)), mode  # nothing lost, nothing twice
    # cpu_only: every map task ran on the CPU-only worker node (the head has 0 CPUs).
    assert out["cpu_only"]["nodes"] and not set(out["cpu_only"]["nodes"]) & tpu_hosts
    assert out["pipeline_cpu_only"]["nodes"] and not set(out["pipeline_cpu_only"]["nodes"]) & tpu_hosts
    # any: Ray Data spread the same work onto TPU hosts as well.
    assert set(out["any"]["nodes"]) & tpu_hosts, out["any"]["nodes"]


def test_modes_and_errors():
    selector = placement_label_selector("cpu_only")
    assert list(selector) == ["ray.io/accelerator-type"]
    value = selector["ray.io/accelerator-type"]
    assert value.startswith("!in(") and "TPU-V6E" in value and "TPU-V5LITEPOD" in value
    assert "TPU-V4" in value and "TPU-V5P" in value
    assert preprocessing_placement("cpu_only") == {"label_selector": selector}
    assert preprocessing_placement("any") == {} == preprocessing_placement("allow_tpu_hosts")
    assert preprocessing_placement("CPU-only") == preprocessing_placement("cpu_only")
    with pytest.raises(SpecError, match=r"preprocess_on must be one of cpu_only, any, allow_tpu_hosts, got 'gpu'"):
        preprocessing_placement("gpu")


def test_selector_is_valid_for_ray():
    from ray._private.label_utils import validate_label_selector

    assert validate_label_selector(placement_label_selector("cpu_only")) is None


def test_apply_placement_keeps_other_labels():
    import ray.data

    ctx = ray.data.DataContext.get_current().copy()
    ctx.execution_options.label_selector = {"ray-subcluster": "etl"}
    apply_placement(ctx, "cpu_only")
    assert ctx.execution_options.label_selector == {
        "ray-subcluster": "etl",
        **placement_label_selector("cpu_only"),
    }
    apply_placement(ctx, "any")
    assert ctx.execution_options.label_selector == {"ray-subcluster": "etl"}
