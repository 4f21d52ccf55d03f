"""Fitting scalers: slicefeed's one-pass fit against Ray's own ``Dataset.aggregate``.

Cases, each over a new in-memory Ray dataset per call (as each pipeline run
fits on its own dataset) of ``--blocks`` blocks, ``--rows`` rows in all, of
``--columns`` float64 columns, on a local Ray with ``--cpus`` CPUs:

- ``slicefeed``: ``Standardize(columns).fit(ds)``: each block's exact partial
  summary on a worker, merged on the driver (``_moments.summarize``);
- ``ray_aggregate``: ``ds.aggregate(ColumnSummary(c) for c in columns)``, the
  same summaries through Ray's aggregation (a hash shuffle: what ``fit`` did
  before);
- ``numpy_limit``: one process, no Ray: ``mean`` and ``std`` of each column of
  the concatenated table (the single-core floor of the arithmetic, rounded
  floats rather than exact sums).

Each case runs once untimed, then ``--repeat`` times in a row, after every
CPU is free again: a Ray aggregation's shuffle actors replace the idle worker
processes, and the next case would otherwise pay for starting new ones (in a
pipeline a fit runs on the workers its read left warm). Both Ray cases must
fit the same bits (the summaries are exact); the benchmark fails instead of
printing a number otherwise. Wall seconds per case (median of the repeats)
and the speedup against ``ray_aggregate``.

    python benchmarks/fit.py --quick --json /tmp/fit.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _benchlib import local_ray, timing_report


def make_blocks(rows: int, columns: int, blocks: int, seed: int = 0) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    per = rows // blocks
    return [pa.table({f"c{k}": rng.normal(size=per) for k in range(columns)}) for _ in range(blocks)]


def run_slicefeed(ray, blocks, cols):
    from slicefeed.transforms import Standardize

    f = Standardize(columns=cols, dtype="float64").fit(ray.data.from_arrow(blocks))
    return f.mean, f.std


def run_ray_aggregate(ray, blocks, cols):
    from slicefeed.transforms._moments import ColumnSummary

    r = ray.data.from_arrow(blocks).aggregate(*(ColumnSummary(c, alias_name=c) for c in cols))
    return {c: r[c]["mean"] for c in cols}, {c: r[c]["std"] for c in cols}


def run_numpy(_ray, blocks, cols):
    t = pa.concat_tables(blocks)
    return ({c: float(np.mean(t.column(c).to_numpy())) for c in cols},
            {c: float(np.std(t.column(c).to_numpy())) for c in cols})


def settle(ray, cpus: int, limit_s: float = 60.0) -> None:
    """Waits until every CPU of the cluster is free again: a Ray aggregation's
    shuffle actors hold CPUs for a while after it returns, and the next case
    must not pay for them."""
    end = time.monotonic() + limit_s
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < end:
        time.sleep(0.05)


CASES = {"slicefeed": run_slicefeed, "ray_aggregate": run_ray_aggregate, "numpy_limit": run_numpy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small inputs (8 blocks of 4 rows)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--columns", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows = 32
    ray = local_ray(args.cpus)
    blocks = make_blocks(args.rows, args.columns, args.blocks)
    cols = list(blocks[0].column_names)
    times: dict[str, list[float]] = {c: [] for c in CASES}
    fitted = {}
    for name, fn in CASES.items():
        settle(ray, args.cpus)
        fn(ray, blocks, cols)  # untimed: workers (or actors) started, modules imported
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fitted[name] = fn(ray, blocks, cols)
            times[name].append(time.perf_counter() - t0)
    if fitted["slicefeed"] != fitted["ray_aggregate"]:
        raise SystemExit("slicefeed and ray_aggregate fitted other statistics: not timed")
    timing_report(times, "ray_aggregate", json_path=args.json,
                  config={k: getattr(args, k) for k in ("rows", "columns", "blocks", "cpus", "repeat")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
