"""SliceSpec: chips, hosts, names, Ray Train arguments, GKE selectors, batch sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from slicefeed.connectors import SpecError
from slicefeed.pipelines import SliceSpec


@pytest.mark.parametrize(
    "topology, accelerator, chips, hosts, per_host, pod_type, ray_type, gke",
    [
        ("2x2x1", "v4", 4, 1, 4, "v4-8", "TPU-V4", "tpu-v4-podslice"),
        ("2x2x2", "v4", 8, 2, 4, "v4-16", "TPU-V4", "tpu-v4-podslice"),
        ("2x2", "v5e", 4, 1, 4, "v5litepod-4", "TPU-V5LITEPOD", "tpu-v5-lite-podslice"),
        ("4x4", "v5litepod", 16, 4, 4, "v5litepod-16", "TPU-V5LITEPOD", "tpu-v5-lite-podslice"),
        ("2x2x2", "v5p", 8, 2, 4, "v5p-16", "TPU-V5P", "tpu-v5p-slice"),
        ("4x4", "v6e", 16, 4, 4, "v6e-16", "TPU-V6E", "tpu-v6e-slice"),
        ("8x8", "TPU-V6E", 64, 16, 4, "v6e-64", "TPU-V6E", "tpu-v6e-slice"),
        # Single-host v6e shapes put up to 8 chips on one VM (Ray's rule).
        ("2x4", "v6e", 8, 1, 8, "v6e-8", "TPU-V6E", "tpu-v6e-slice"),
        ("1x1", "v6e", 1, 1, 1, "v6e-1", "TPU-V6E", "tpu-v6e-slice"),
    ],
)
def test_shapes_and_names(topology, accelerator, chips, hosts, per_host, pod_type, ray_type, gke):
    spec = SliceSpec(topology, accelerator)
    assert (spec.num_chips, spec.num_hosts, spec.chips_per_host) == (chips, hosts, per_host)
    assert spec.num_devices == chips
    assert spec.pod_type == pod_type
    assert spec.ray_accelerator_type == ray_type
    assert spec.gke_accelerator == gke
    assert spec.head_resource == f"TPU-{pod_type}-head"
    assert spec.node_selectors() == {
        "cloud.google.com/gke-tpu-accelerator": gke,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    assert spec.scaling_config_kwargs() == {
        "num_workers": hosts,
        "use_tpu": True,
        "topology": topology,
        "accelerator_type": ray_type,
        "resources_per_worker": {"TPU": per_host},
    }


@pytest.mark.parametrize(
    "spelling", ["v6e", "V6E", "TPU-V6E", "tpu-v6e", " v6e ", "tpu-v6e-slice"]
)
def test_accelerator_spellings_are_equal(spelling):
    assert SliceSpec("4x4", spelling) == SliceSpec("4x4", "v6e")
    assert SliceSpec("4x4", spelling).accelerator == "v6e"


@pytest.mark.parametrize("spelling", ["v5e", "v5litepod", "TPU-V5LITEPOD", "tpu-v5-lite-podslice"])
def test_v5e_aliases(spelling):
    assert SliceSpec(" 4X4 ", spelling) == SliceSpec("4x4", "v5litepod")


def test_frozen_and_hashable():
    spec = SliceSpec("4x4", "v6e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.topology = "8x8"
    assert len({spec, SliceSpec("4x4", "TPU-V6E")}) == 1


def test_scaling_config_accepted_by_ray_train():
    pytest.importorskip("pydantic")
    from ray.train import ScalingConfig

    kwargs = SliceSpec("4x4", "v6e").scaling_config_kwargs()
    config = ScalingConfig(**kwargs)
    assert config.num_workers == 4 and config.topology == "4x4"


def test_matches_ray_worker_count():
    from ray.util.tpu import get_tpu_worker_resources

    for topology, accelerator in [("4x4", "v6e"), ("2x2x2", "v4"), ("8x8", "v5e"), ("2x2x4", "v5p")]:
        spec = SliceSpec(topology, accelerator)
        workers, resources = get_tpu_worker_resources(spec.topology, spec.ray_accelerator_type)
        assert (workers, resources["TPU"]) == (spec.num_hosts, spec.chips_per_host)


def test_from_pod_type():
    assert SliceSpec.from_pod_type("v6e-16", "4x4") == SliceSpec("4x4", "v6e")
    assert SliceSpec.from_pod_type("v4-16", "2x2x2") == SliceSpec("2x2x2", "v4")
    with pytest.raises(SpecError, match=r"pod type 'v6e-8' does not match topology '4x4'.*v6e-16"):
        SliceSpec.from_pod_type("v6e-8", "4x4")


# -- errors --------------------------------------------------------------------


def test_unknown_accelerator_names_valid_ones():
    with pytest.raises(SpecError) as e:
        SliceSpec("4x4", "v7")
    msg = str(e.value)
    assert "unknown TPU accelerator 'v7'" in msg
    for name in ("v4", "v5e", "v5p", "v6e", "TPU-V6E"):
        assert name in msg


def test_pod_type_as_accelerator_is_explained():
    with pytest.raises(SpecError, match=r"'v6e-16' looks like a pod type.*SliceSpec\('4x4', 'v6e'\)"):
        SliceSpec("4x4", "v6e-16")


@pytest.mark.parametrize("accelerator", [None, "", 6])
def test_accelerator_must_be_string(accelerator):
    with pytest.raises(SpecError, match="accelerator must be a non-empty string"):
        SliceSpec("4x4", accelerator)


def test_unknown_topology_lists_valid_ones_in_chip_order():
    with pytest.raises(SpecError) as e:
        SliceSpec("3x3", "v6e")
    assert str(e.value) == (
        "topology '3x3' is not a v6e slice shape; valid v6e topologies: "
        "1x1, 2x2, 2x4, 2x8, 4x4, 4x8, 8x8, 8x16, 16x16."
    )


def test_2d_topology_on_3d_generation():
    with pytest.raises(SpecError, match=r"topology '4x4' is not a v4 slice shape; valid v4 topologies: 2x2x1, 2x2x2"):
        SliceSpec("4x4", "v4")


def test_topology_must_be_string():
    with pytest.raises(SpecError, match="topology must be a string"):
        SliceSpec(16, "v6e")


# -- global batch size -----------------------------------------------------------


def test_valid_global_batch_sizes():
    spec = SliceSpec("4x4", "v6e")
    assert spec.validate_global_batch_size(64) == 64
    assert spec.validate_global_batch_size(np.int64(16)) == 16
    assert spec.validate_global_batch_size(12, devices=4) == 12


def test_global_batch_size_proposes_nearest_multiples():
    spec = SliceSpec("4x4", "v6e")
    with pytest.raises(SpecError) as e:
        spec.validate_global_batch_size(100)
    assert str(e.value) == (
        "global_batch_size (100) must be divisible by the 16 devices of a v6e 4x4 slice "
        "(100 = 6 x 16 + 4); try 96 or 112."
    )


def test_global_batch_size_below_device_count():
    with pytest.raises(SpecError, match=r"global_batch_size \(5\) .* try 16\.$"):
        SliceSpec("4x4", "v6e").validate_global_batch_size(5)


def test_global_batch_size_explicit_devices():
    with pytest.raises(SpecError, match=r"divisible by the 8 devices .* try 8 or 16\."):
        SliceSpec("4x4", "v6e").validate_global_batch_size(10, devices=8)


@pytest.mark.parametrize("bad", [0, -16])
def test_global_batch_size_not_positive(bad):
    with pytest.raises(SpecError, match=rf"global_batch_size \({bad}\) must be positive.*try 16\."):
        SliceSpec("4x4", "v6e").validate_global_batch_size(bad)


@pytest.mark.parametrize("bad", [1.5, "64", True])
def test_global_batch_size_not_integer(bad):
    with pytest.raises(SpecError, match="global_batch_size must be an integer"):
        SliceSpec("4x4", "v6e").validate_global_batch_size(bad)


def test_devices_must_be_positive():
    with pytest.raises(SpecError, match="devices must be a positive integer, got 0"):
        SliceSpec("4x4", "v6e").validate_global_batch_size(16, devices=0)


def test_docstring_examples_run():
    import doctest

    from slicefeed.pipelines._ops import topology as _topology

    result = doctest.testmod(_topology, raise_on_error=False)
    assert result.attempted >= 3 and result.failed == 0
