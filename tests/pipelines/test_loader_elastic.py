"""Elastic resume in one process: a state resumed on another host layout.

Several hosts are tested with real processes in ``test_loader_multihost.py``;
here the layout change is the window size (``shuffle_buffer_rows``), which
takes the same re-split path, and the refusals.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from slicefeed.connectors import SpecError


def _ids(batch) -> list[int]:
    ids = np.asarray(batch["id"])
    if "mask" in batch:
        ids = ids[np.asarray(batch["mask"])]
    return ids.tolist()


def _take(loader, steps=None) -> dict[int, list[int]]:
    """Ids delivered per epoch (by the state's epoch before each batch), up to ``steps``."""
    out: dict[int, list[int]] = {}
    for i, batch in enumerate(loader):
        sd = loader.state_dict()
        epoch = sd["epoch"] if sd["step"] > 0 else sd["epoch"] - 1
        out.setdefault(epoch, []).extend(_ids(batch))
        if steps is not None and i + 1 >= steps:
            break
    return out


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_resume_on_another_layout_delivers_each_row_once(jax_cpu, committed, remainder):
    """An epoch taken on three window layouts (state saved after 3 and then 2
    more steps) delivers every row exactly once ("pad"), or drops fewer rows
    than one batch ("drop"); the next epoch is planned for the new layout."""
    from slicefeed.pipelines import JaxLoader

    uri, n = committed
    kw = {"global_batch_size": 8, "num_epochs": 2, "shuffle": True, "seed": 3,
          "remainder": remainder}
    a = JaxLoader(uri, shuffle_buffer_rows=16, **kw)
    got = _take(a, 3)
    sd_a = a.state_dict()
    a.close()
    assert sd_a["stages"] == [] and sd_a["hosts"]["window_rows"] == 16

    b = JaxLoader(uri, shuffle_buffer_rows=24, state=sd_a, **kw)
    assert b.state_dict()["step"] == 0  # the rest of the epoch, re-planned
    assert b.state_dict()["stages"] == [
        {"process_count": 1, "local_batch_size": 8, "window_rows": 16, "steps": 3}
    ]
    for e, ids in _take(b, 2).items():
        got.setdefault(e, []).extend(ids)
    sd_b = b.state_dict()
    b.close()
    assert sd_b["step"] == 2 and len(sd_b["stages"]) == 1

    c = JaxLoader(uri, shuffle_buffer_rows=32, state=sd_b, **kw)
    assert len(c.state_dict()["stages"]) == 2
    rest = _take(c)
    for e, ids in rest.items():
        got.setdefault(e, []).extend(ids)
    assert c.state_dict()["stages"] == []  # the next epoch is the plain plan
    assert sorted(got) == [0, 1]
    for e in (0, 1):
        assert len(got[e]) == len(set(got[e])), f"epoch {e}: a row was delivered twice"
        if remainder == "pad":
            assert sorted(got[e]) == list(range(n)), e
        else:
            assert n - len(got[e]) < 8 and set(got[e]) <= set(range(n)), e
    # epoch 1 on the final layout is exactly what a fresh loader delivers
    fresh = _take(JaxLoader(uri, shuffle_buffer_rows=32, **kw))
    assert rest[1] == fresh[1]

    # load_state_dict resumes the same way, also inside a resumed epoch
    d = JaxLoader(uri, shuffle_buffer_rows=32, **kw)
    d.load_state_dict(sd_b)
    assert _take(d) == rest

    # an error in a resumed epoch names the file and row of the bad value
    # (files of 30, 45, 17, 50 rows: ids 92.. are in part-00003)
    e = JaxLoader(uri, shuffle_buffer_rows=32, dtypes={"id": "int8"}, state=sd_b, **kw)
    with pytest.raises(SpecError, match=r"file 'part-00003.parquet' row (\d+): value (\d+)") as err:
        _take(e)
    row, value = re.search(r"row (\d+): value (\d+)", str(err.value)).groups()
    assert int(value) == 92 + int(row) > 127


def test_other_layout_refused_for_other_sources_and_old_states(jax_cpu, ray_cluster, committed):
    import ray

    from slicefeed.pipelines import JaxLoader

    ds = ray.data.from_arrow(pa.table({"id": np.arange(40, dtype=np.int32)}))
    sd = JaxLoader(ds, global_batch_size=8).state_dict()
    moved = {**sd, "step": 1, "hosts": {**sd["hosts"], "process_count": 2,
                                        "local_batch_size": 4}}
    with pytest.raises(SpecError, match="only a committed dataset .its URI. resumes on another"):
        JaxLoader(ds, global_batch_size=8, state=moved)

    uri, _ = committed
    sd = JaxLoader(uri, global_batch_size=8).state_dict()
    with pytest.raises(SpecError, match=r"state version 1 is not supported \(this slicefeed "
                       r"reads versions 3 and 4\)"):
        JaxLoader(uri, global_batch_size=8, state={**sd, "version": 1})
    with pytest.raises(SpecError, match=r"this state \(version 2\) .* another row order"):
        JaxLoader(uri, global_batch_size=8, state={**sd, "version": 2})
    with pytest.raises(SpecError, match=r"state is a list, not a mapping"):
        JaxLoader(uri, global_batch_size=8, state=[sd])
    with pytest.raises(SpecError, match=r"state key 'hosts' is None"):
        JaxLoader(uri, global_batch_size=8, state={**sd, "hosts": None})
    bad = {**sd, "stages": [{"process_count": 2, "local_batch_size": 4, "window_rows": 4,
                             "steps": 10**6}]}
    with pytest.raises(SpecError, match=r"not valid for this dataset: stage 0 took 1000000"):
        JaxLoader(uri, global_batch_size=8, state=bad)


def test_version_3_state_resumes(jax_cpu, committed):
    """A state saved before the host layout was recorded (version 3: host count
    and window size inside the plan, no dataset version) resumes exactly."""
    from slicefeed.pipelines import JaxLoader
    from tests.pipelines._conformance import digests

    uri, _ = committed
    kw = {"global_batch_size": 8, "shuffle": True, "seed": 1, "shuffle_buffer_rows": 16}
    ref = digests(JaxLoader(uri, **kw))
    a = JaxLoader(uri, **kw)
    digests(a, limit=4)
    sd = a.state_dict()
    plan = {k: v for k, v in sd["plan"].items() if k != "dataset_version"}
    v3 = {"version": 3, "epoch": sd["epoch"], "step": sd["step"], "seed": sd["seed"],
          "plan": {**plan, "process_count": 1, "window_rows": 16}}
    assert digests(JaxLoader(uri, state=v3, **kw)) == ref[4:]
    with pytest.raises(SpecError, match="saved with global_batch_size=16"):
        JaxLoader(uri, state={**v3, "plan": {**v3["plan"], "global_batch_size": 16}}, **kw)
