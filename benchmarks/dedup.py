"""Deduplicate at scale: slicefeed's dataset-level ``deduplicate`` against Ray's per-key groupby.

Cases, each over the same in-memory Ray dataset (``--blocks`` blocks of
``--rows`` rows in all, text keys drawn from ``--keys`` distinct values, with
provenance columns as a pipeline's reader adds them), on a local Ray with
``--cpus`` CPUs:

- ``slicefeed``: ``Deduplicate(columns=["text"]).dataset_op(ds)`` (groups rows
  into ``DEDUP_BUCKETS`` buckets of the key hash, one exact pass per bucket,
  spread over ``DEDUP_PARTITIONS`` = 200 shuffle partitions, Ray's default);
- ``slicefeed_16``: the same with ``partitions: 16`` (the fixed cost of a
  partition against the rows each reduce task holds);
- ``ray_map_groups``: Ray Data's ``ds.groupby("text").map_groups(...)`` keeping
  each key's first row by provenance (one Python call per distinct key: what
  ``deduplicate`` did before it grouped by bucket);
- ``pyarrow_limit``: one process, no Ray: the whole table in memory,
  ``group_by("text").aggregate(idx min)`` (the single-core floor of the work).

Every case must keep the same survivors (the rows with the smallest
(``_sf_file``, ``_sf_row``) per key); the benchmark fails instead of printing
a number otherwise. Wall seconds per case, median of ``--repeat`` rounds (cases
alternate within a round), and the ratio of rows/s to ``ray_map_groups``.

    python benchmarks/dedup.py --quick --json /tmp/dedup.json
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


def make_blocks(rows: int, keys: int, blocks: int, seed: int = 0) -> list[pa.Table]:
    from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW

    rng = np.random.default_rng(seed)
    per = rows // blocks
    out = []
    for b in range(blocks):
        k = rng.integers(0, keys, per)
        out.append(pa.table({"text": pa.array([f"document number {x}" for x in k]),
                             "v": np.arange(b * per, (b + 1) * per),
                             PROVENANCE_FILE: [f"f{b:03d}.jsonl"] * per,
                             PROVENANCE_ROW: np.arange(per)}))
    return out


def survivors(tables: list[pa.Table]) -> list[int]:
    """The ``v`` of every kept row, sorted (what each case must agree on)."""
    return sorted(int(v) for t in tables for v in t.column("v").to_pylist())


def run_slicefeed(ray, blocks, **options):
    from slicefeed.transforms import transform_from_spec

    t = transform_from_spec({"deduplicate": {"columns": ["text"], **options}})
    return ray.get(t.dataset_op(ray.data.from_arrow(blocks)).to_arrow_refs())


def run_slicefeed_16(ray, blocks):
    return run_slicefeed(ray, blocks, partitions=16)


def run_ray_map_groups(ray, blocks):
    from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW

    def first(group: pa.Table) -> pa.Table:
        return group.sort_by([(PROVENANCE_FILE, "ascending"), (PROVENANCE_ROW, "ascending")]).slice(0, 1)

    ds = ray.data.from_arrow(blocks).groupby("text").map_groups(first, batch_format="pyarrow")
    return ray.get(ds.to_arrow_refs())


def run_pyarrow(_ray, blocks):
    from slicefeed.connectors import PROVENANCE_FILE, PROVENANCE_ROW

    t = pa.concat_tables(blocks).sort_by([(PROVENANCE_FILE, "ascending"), (PROVENANCE_ROW, "ascending")])
    t = t.append_column("idx", pa.array(np.arange(t.num_rows)))
    firsts = t.group_by("text", use_threads=False).aggregate([("idx", "min")])
    return [t.take(pa.array(np.sort(firsts.column("idx_min").to_numpy())))]


CASES = {"slicefeed": run_slicefeed, "slicefeed_16": run_slicefeed_16, "ray_map_groups": run_ray_map_groups, "pyarrow_limit": run_pyarrow}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small inputs (20k rows, 5k keys)")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.keys, args.repeat = 20_000, 5_000, 1
    ray = local_ray(args.cpus)
    blocks = make_blocks(args.rows, args.keys, args.blocks)
    times: dict[str, list[float]] = {c: [] for c in CASES}
    expected = None
    for _ in range(args.repeat):
        for name, fn in CASES.items():
            t0 = time.perf_counter()
            out = fn(ray, blocks)
            times[name].append(time.perf_counter() - t0)
            got = survivors(out)
            if expected is None:
                expected = got
            elif got != expected:
                raise SystemExit(f"{name} kept other rows ({len(got)} vs {len(expected)}): not timed")
    timing_report(times, "ray_map_groups", json_path=args.json, rows_out=len(expected or []),
                  config={k: getattr(args, k) for k in ("rows", "keys", "blocks", "cpus", "repeat")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
