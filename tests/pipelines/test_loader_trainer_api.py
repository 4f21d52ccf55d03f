"""What a trainer calls besides iteration: len(loader) and load_state_dict(sd)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.pipelines._conformance import digests


@pytest.fixture(scope="module")
def env(ray_cluster, jax_cpu):
    return jax_cpu


def test_len_is_steps_per_epoch_or_says_why_not(env, committed):
    import ray

    from slicefeed.pipelines import JaxLoader

    uri, n = committed
    assert len(JaxLoader(uri, global_batch_size=16)) == n // 16
    assert len(JaxLoader(uri, global_batch_size=16, remainder="pad", num_epochs=3)) == -(-n // 16)
    ds = ray.data.from_arrow(pa.table({"a": np.arange(40, dtype=np.int32)}))
    assert len(JaxLoader(ds, global_batch_size=8)) == 5
    unknown = ds.map_batches(lambda b: b, batch_format="pyarrow")
    with pytest.raises(TypeError, match="steps per epoch are not known before reading"):
        len(JaxLoader(unknown, global_batch_size=8))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_load_state_dict_resumes_exactly(env, committed, prefetch):
    from slicefeed.pipelines import JaxLoader

    uri, _ = committed
    kw = {"global_batch_size": 16, "num_epochs": 2, "shuffle": True, "seed": 4, "shuffle_buffer_rows": 32,
              "prefetch": prefetch}
    ref = digests(JaxLoader(uri, **kw))
    a = JaxLoader(uri, **kw)
    head = digests(a, limit=5)
    sd = a.state_dict()
    a.close()
    b = JaxLoader(uri, **kw)
    b.load_state_dict(sd)  # before iterating
    assert head + digests(b) == ref
    c = JaxLoader(uri, **kw)
    digests(c, limit=2)  # after iterating (prefetched batches are dropped)
    c.load_state_dict(sd)
    assert head + digests(c) == ref
    with pytest.raises(Exception, match="saved with global_batch_size=16"):
        JaxLoader(uri, **{**kw, "global_batch_size": 32}).load_state_dict(sd)
