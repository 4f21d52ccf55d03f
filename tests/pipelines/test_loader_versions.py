"""A JaxLoader over a committed-dataset URI reads the version it opened to the end."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipelines._data import make_table


@pytest.fixture
def env(ray_cluster, jax_cpu):
    return jax_cpu


def test_loader_keeps_reading_the_version_it_opened(env, local_dir):
    import ray

    from slicefeed.connectors import current_version, write_parquet
    from slicefeed.pipelines import JaxLoader

    write_parquet(ray.data.from_arrow(make_table(0, 64)).repartition(8), local_dir)
    # Windows of 8 rows, read one at a time: most of the epoch is read after
    # the overwrite below.
    loader = JaxLoader(local_dir, global_batch_size=8, shuffle=True, seed=0,
                       shuffle_buffer_rows=8, num_epochs=1, prefetch=1, local_read_ahead=1)
    ids = [np.asarray(next(loader)["id"])]
    state = loader.state_dict()
    assert state["plan"]["dataset_version"] == 1
    write_parquet(ray.data.from_arrow(make_table(1000, 64)).repartition(8), local_dir,
                  overwrite=True)
    assert current_version(local_dir) == 2
    ids += [np.asarray(b["id"]) for b in loader]
    loader.close()
    assert sorted(np.concatenate(ids).tolist()) == list(range(64))
    # A state records the version: resuming it after the overwrite reads version 1.
    resumed = JaxLoader(local_dir, global_batch_size=8, shuffle=True, seed=0,
                        shuffle_buffer_rows=8, num_epochs=1, state=state)
    rest = [np.asarray(b["id"]) for b in resumed]
    assert sorted(np.concatenate(ids[:1] + rest).tolist()) == list(range(64))
    assert JaxLoader(local_dir, global_batch_size=8).state_dict()["plan"]["dataset_version"] == 2


@pytest.mark.parametrize("reader", ["local", "ray"])
def test_loader_whose_version_was_vacuumed_says_so(env, local_dir, reader):
    """A vacuum that removes the version a loader reads (here with
    retain_hours=0 right after an overwrite, before the first batch) made its
    shard reads fail with a bare FileNotFoundError; the error names the shard,
    says the manifest lists it, and what removes such files and what to do.
    Resuming a state of the removed version says the version is gone."""
    import ray

    from slicefeed.connectors import (
        NotCommittedError,
        ShardMismatchError,
        vacuum,
        write_parquet,
    )
    from slicefeed.pipelines import JaxLoader

    write_parquet(ray.data.from_arrow(make_table(0, 64)).repartition(4), local_dir)
    # The plan comes from the manifest: no shard is opened before the first batch.
    loader = JaxLoader(local_dir, global_batch_size=8, num_epochs=1, reader=reader)
    state = loader.state_dict()
    write_parquet(ray.data.from_arrow(make_table(1000, 64)).repartition(4), local_dir,
                  overwrite=True)
    vacuum(local_dir, retain_hours=0)
    # Under reader="ray" too, the named message leads (not Ray's task traceback).
    with pytest.raises(ShardMismatchError, match=r"^[^\n]*part-\S+\.parquet: listed by version 1 of "
                                                 r"the committed dataset, but gone.*vacuum"):
        for _ in loader:
            pass
    loader.close()
    with pytest.raises(NotCommittedError, match=r"version 1"):
        JaxLoader(local_dir, global_batch_size=8, num_epochs=1, state=state)
