#!/usr/bin/env python
"""Trainer CPU per row on a ``DataIterator``, in one process: what Ray's own block
delivery costs before any loader touches a row, and what each way of turning the
delivered rows into device arrays adds.

A materialised Dataset of the streaming benchmark's rows (``tokens``,
``segment_ids``, ``positions``: ``fixed_size_list<int32>[2048]``, 24,576 B/row) in
blocks of ``--block-rows`` rows is read through ``ds.streaming_split(1)[0]`` (the
``DataIterator`` a ``JaxTrainer`` worker gets) on this process's CPU devices.

Cases (the same iterator, the same batch size):

- ``ray_blocks``: ``iter_batches(batch_size=None)``, rows not converted: Ray's block
  delivery alone (object fetches, its prefetch threads, the split's coordinator calls).
- ``blocks_sliced``: ``ray_blocks`` cut into batches of ``B`` rows here (zero-copy
  slices; a batch spanning two blocks is chunked): re-batching without Ray's batcher.
- ``ray_batches``: ``iter_batches(batch_size=B, batch_format="pyarrow")``: plus
  Ray's re-batching.
- ``minimal``: ``ray_batches`` + a zero-copy NumPy view of every column +
  ``jax.device_put`` onto the devices: the least any loader on this iterator does.
- ``slicefeed``: ``JaxLoader(it, global_batch_size=B)``.
- ``ray``: ``it.iter_jax_batches(batch_size=B, collate_fn=<the same views>)``.

CPU = ``getrusage(RUSAGE_SELF)`` user + system of the whole process (Ray's
core-worker threads included, as in a trainer) over the batches after the first
``WARMUP``. Validation: every case delivered every row once (``tokens[:, 0]`` is
the row's index: its count, sum and sum of squares), ``(B, 2048)`` ``int32``.
Cases run round-robin, ``--repeat`` times; medians are reported. Usage::

    python benchmarks/iterator_cpu.py            # 8,192 rows, blocks of 512, batch 128, 5 repeats
    python benchmarks/iterator_cpu.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import HERE, machine_info

SEQ_LEN = 2048
COLUMNS = ("tokens", "segment_ids", "positions")
ROW_BYTES = SEQ_LEN * 4 * len(COLUMNS)
CASES = ("ray_blocks", "blocks_sliced", "ray_batches", "minimal", "slicefeed", "ray")
WARMUP = 4  # batches (or blocks) before the clock starts


def _values(arr):
    """The values of a ``fixed_size_list`` array's rows: a zero-copy slice, as the
    loader takes them (``flatten()`` dispatches a compute kernel per call)."""
    return arr.values.slice(arr.offset * SEQ_LEN, len(arr) * SEQ_LEN)


def _view(col):
    """Arrow ``fixed_size_list`` column -> zero-copy ``(n, d)`` NumPy view."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return _values(col).to_numpy(zero_copy_only=True).reshape(len(col), SEQ_LEN)


def _first_tokens(t):
    """``tokens[:, 0]`` of an Arrow table (any chunking), without copying the rows."""
    import numpy as np

    return np.concatenate([_values(c).to_numpy()[::SEQ_LEN]
                           for c in t.column("tokens").chunks] or [np.zeros(0, np.int32)])


def make_dataset(rows: int, block_rows: int):
    import numpy as np
    import pyarrow as pa
    import ray.data

    def block(lo: int) -> pa.Table:
        n = min(block_rows, rows - lo)
        rng = np.random.default_rng(lo)
        cols = {}
        for c in COLUMNS:
            v = rng.integers(0, 50_000, size=(n, SEQ_LEN), dtype=np.int32)
            if c == "tokens":
                v[:, 0] = np.arange(lo, lo + n, dtype=np.int32)
            cols[c] = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), SEQ_LEN)
        return pa.table(cols)

    return ray.data.from_arrow([block(lo) for lo in range(0, rows, block_rows)]).materialize()


def batches(case: str, it, B: int):
    """(rows, first tokens of the rows) per delivered batch."""
    import jax
    import numpy as np
    import pyarrow as pa

    if case == "ray_blocks":
        for t in it.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield t.num_rows, _first_tokens(t)
        return
    if case == "blocks_sliced":
        carry = None
        for t in it.iter_batches(batch_size=None, batch_format="pyarrow"):
            t = t if carry is None else pa.concat_tables([carry, t])
            i = 0
            while t.num_rows - i >= B:
                yield B, _first_tokens(t.slice(i, B))
                i += B
            carry = t.slice(i)
        return
    if case == "ray_batches":
        for t in it.iter_batches(batch_size=B, batch_format="pyarrow", drop_last=True):
            yield t.num_rows, _first_tokens(t)
        return
    if case == "minimal":
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
        src = ({c: jax.device_put(_view(t.column(c)), sharding) for c in t.column_names}
               for t in it.iter_batches(batch_size=B, batch_format="pyarrow", drop_last=True))
    elif case == "slicefeed":
        from slicefeed.pipelines import JaxLoader

        src = iter(JaxLoader(it, global_batch_size=B))
    else:
        from ray.data.collate_fn import ArrowBatchCollateFn

        class Views(ArrowBatchCollateFn):
            def __call__(self, table):
                return {c: _view(table.column(c)) for c in table.column_names}

        src = it.iter_jax_batches(batch_size=B, collate_fn=Views(), drop_last=True)
    for b in src:
        jax.block_until_ready(b)
        tok = b["tokens"]
        if tuple(tok.shape) != (B, SEQ_LEN) or tok.dtype != np.int32:
            raise AssertionError(f"{case}: a batch of {tok.shape} {tok.dtype}")
        yield B, np.concatenate([np.asarray(s.data)[:, 0] for s in tok.addressable_shards])


def run_case(case: str, ds, B: int, rows: int) -> dict:
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    it = ds.streaming_split(1)[0]
    n = 0
    s1 = s2 = 0
    timed = 0
    c0 = t0 = None
    for k, (m, first) in enumerate(batches(case, it, B), 1):
        n += m
        f = first.astype("int64")
        s1 += int(f.sum())
        s2 += int((f * f).sum())
        if k == WARMUP:
            c0, t0 = cpu(), time.perf_counter()
        elif k > WARMUP:
            timed += m
    c1, t1 = cpu(), time.perf_counter()
    expect = rows - rows % B if case != "ray_blocks" else rows
    want1 = sum(range(expect))
    want2 = sum(i * i for i in range(expect))
    error = None if (n, s1, s2) == (expect, want1, want2) else (
        f"rows {n} (want {expect}), sums {s1}/{s2} (want {want1}/{want2})")
    return {"case": case, "rows": n, "timed_rows": timed, "error": error,
            "cpu_us_per_row": (c1 - c0) / timed * 1e6 if timed else None,
            "rows_per_s": timed / (t1 - t0) if timed else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--block-rows", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--quick", action="store_true", help="4,096 rows, 2 repeats")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.rows, a.repeat = 4096, 2
    cases = [c for c in a.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    import ray

    ray.init(num_cpus=2, object_store_memory=1024 * 2**20, include_dashboard=False,
             log_to_driver=False)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = make_dataset(a.rows, a.block_rows)
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(a.repeat):
        order = cases if r % 2 == 0 else cases[::-1]
        for c in order:
            res = run_case(c, ds, a.batch_size, a.rows)
            runs[c].append(res)
            print(f"repeat {r} {c:12s} {res['cpu_us_per_row']:.1f} us/row "
                  f"{res['rows_per_s']:,.0f} rows/s" + (f" FAILED: {res['error']}"
                                                       if res["error"] else ""), flush=True)
    failed = any(res["error"] for rs in runs.values() for res in rs)
    summary = {}
    for c, rs in runs.items():
        cpus = [x["cpu_us_per_row"] for x in rs]
        summary[c] = {"cpu_us_per_row_median": statistics.median(cpus),
                      "cpu_us_per_row_range": [min(cpus), max(cpus)],
                      "rows_per_s_median": statistics.median(x["rows_per_s"] for x in rs)}
    print(f"\n{a.rows} rows of {ROW_BYTES:,} B in blocks of {a.block_rows}, batch "
          f"{a.batch_size}, {a.repeat} repeats (median, range):")
    for c, s in summary.items():
        lo, hi = s["cpu_us_per_row_range"]
        print(f"  {c:12s} {s['cpu_us_per_row_median']:5.1f} us/row ({lo:.1f}-{hi:.1f})  "
              f"{s['rows_per_s_median']:>9,.0f} rows/s")
    out = a.json or os.path.join(HERE, "results",
                                 "iterator_cpu-quick.json" if a.quick else "iterator_cpu.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"machine": machine_info(), "args": vars(a), "summary": summary,
                   "runs": runs, "failed": failed}, f, indent=1)
    print(f"wrote {out}")
    ray.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
