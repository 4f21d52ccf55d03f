#!/usr/bin/env python
"""Loader throughput, side by side: slicefeed's JaxLoader against the usual choices.

Cases (same Parquet files, same global batch size, same 8-device CPU mesh):

- ``pyarrow_limit``: pyarrow's multi-threaded dataset scanner into dense NumPy
  arrays (no JAX): what this machine can decode.
- ``raw_jax``: one process, ``pq.ParquetFile.iter_batches`` ->
  ``jax.make_array_from_process_local_data``: the simplest loader.
- ``ray_iter_jax_batches``: ``ray.data.read_parquet(files).iter_jax_batches(...)``
  as documented, with the minimal Arrow ``collate_fn`` that makes
  ``fixed_size_list`` columns dense (Ray yields object arrays for them otherwise).
- ``grain``: ``grain.experimental.ParquetIterDataset`` -> ``.batch`` ->
  ``grain.experimental.device_put`` (Grain's documented pipeline).
- ``slicefeed``: ``JaxLoader(<committed dataset URI>)`` (its default ``reader="local"``).
- ``slicefeed_ray``: the same with ``reader="ray"`` (one Ray Data task per window;
  not in ``--quick``).
- ``ray_iter_jax_batches_default_store``, ``slicefeed_ray_default_store``: the
  two Ray-read cases again at Ray's default object-store size (30 % of RAM);
  the cases above run with a 256 MB store, smaller than the dataset (only the
  first is in ``--quick``).

Every case runs in its own subprocess (isolated RSS, Ray state and JAX runtime)
and is validated: a case that delivers the wrong number of rows or the wrong
token checksum FAILS instead of reporting a number.

Every case reads the dataset ``--epochs`` times (default 4; ``--quick`` 2), one
epoch after the other as a training loop does, and its steady rate is taken
over all of them. One pass over 32,768 rows is too short to be steady: the
``pyarrow_limit`` scanner decodes several files ahead during the warm-up
batches, so a one-pass rate counted work done before the measured window and
came out above what the two cores can decode at all (benchmarks/README.md).

Usage::

    python benchmarks/loader.py --quick             # a few minutes
    python benchmarks/loader.py --repeat 3          # full run; medians of 3
    python benchmarks/loader.py --cases slicefeed,raw_jax --batch-sizes 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import (
    COLUMNS,
    HERE,
    LOADER_DTYPES,
    ROW_BYTES,
    RSS,
    SEQ_LEN,
    Consumer,
    ensure_dataset,
    machine_info,
    memory_bound,
    memory_lines,
    memory_summary,
    peak_rss_self_mb,
    process_env,
    run_child,
    validate,
    warm_page_cache,
)

#: Suffix of a Ray case run at Ray's default object-store size (30 % of RAM)
#: instead of the 256 MB store the other Ray cases get (see ``_ray_init``).
DEFAULT_STORE = "_default_store"
CASES = ("pyarrow_limit", "raw_jax", "ray_iter_jax_batches", "grain", "slicefeed", "slicefeed_ray",
         "ray_iter_jax_batches" + DEFAULT_STORE, "slicefeed_ray" + DEFAULT_STORE)
QUICK_CASES = CASES[:5] + ("ray_iter_jax_batches" + DEFAULT_STORE,)
TARGETS = {  # slicefeed rows/s divided by the case's, at least (benchmarks/README.md)
    "ray_iter_jax_batches": 1.3,
    "grain": 1.0,
    "raw_jax": 1.0,
    "pyarrow_limit": 0.5,
}


# =========================================================================== child side


def _dense(col):
    """Arrow column -> dense NumPy (fixed_size_list -> (n, d) view of the values)."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        n = len(col)
        return col.flatten().to_numpy(zero_copy_only=True).reshape(n, col.type.list_size)
    return col.to_numpy(zero_copy_only=True)


def _rebatch(batches, rows: int):
    """Record batches of any size -> tables of exactly ``rows`` rows (last one dropped if
    short, like every other case's drop_last). Zero-copy when a batch already fits."""
    import pyarrow as pa

    buf, have = [], 0
    for rb in batches:
        buf.append(rb)
        have += rb.num_rows
        while have >= rows:
            t = pa.Table.from_batches(buf)
            yield t.slice(0, rows)
            rest = t.slice(rows)
            buf = rest.to_batches() if rest.num_rows else []
            have = rest.num_rows


def _mesh_sharding():
    import jax
    import numpy as np
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    try:
        devices = mesh_utils.create_device_mesh((jax.device_count(),))
    except Exception:  # noqa: BLE001
        devices = np.array(jax.devices())
    return NamedSharding(Mesh(devices, ("data",)), PartitionSpec("data"))


def _ray_init(extra: dict, cfg: dict) -> None:
    import ray

    # Smaller than the full dataset (269 MB decoded), as in production where
    # data >> object store: Ray cannot pre-read everything before the first
    # batch and call the rest "steady state". The ``*_default_store`` cases
    # keep Ray's own default instead.
    store = None if cfg.get("default_store") else 256 << 20
    t = time.perf_counter()
    for attempt in range(3):
        try:
            ray.init(
                address="local",
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                object_store_memory=store,
            )
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    extra["ray_init_s"] = time.perf_counter() - t
    extra["object_store_bytes"] = ray.cluster_resources().get("object_store_memory")
    extra["ray_init_attempts"] = attempt + 1


def case_pyarrow_limit(cfg, meta, consume, extra) -> float:
    import pyarrow.dataset as pads

    B = cfg["batch_size"]
    RSS.start()  # after the case's imports, before its loader is built
    t0 = time.perf_counter()
    for _ in range(cfg["epochs"]):
        ds = pads.dataset(meta["files"], format="parquet")
        batches = ds.to_batches(batch_size=B, use_threads=True, columns=list(COLUMNS))
        for t in _rebatch(batches, B):
            consume({c: _dense(t.column(c)) for c in COLUMNS})
    return t0


def case_raw_jax(cfg, meta, consume, extra) -> float:
    import jax
    import pyarrow.parquet as pq

    B = cfg["batch_size"]
    sharding = _mesh_sharding()
    RSS.start()  # after the case's imports, before its loader is built
    t0 = time.perf_counter()

    def record_batches():
        for path in meta["files"]:
            yield from pq.ParquetFile(path).iter_batches(batch_size=B, columns=list(COLUMNS))

    for _ in range(cfg["epochs"]):
        for t in _rebatch(record_batches(), B):
            consume(
                {
                    c: jax.make_array_from_process_local_data(sharding, _dense(t.column(c)))
                    for c in COLUMNS
                }
            )
    return t0


def case_ray_iter_jax_batches(cfg, meta, consume, extra) -> float:
    _ray_init(extra, cfg)
    import ray
    from ray.data.collate_fn import ArrowBatchCollateFn

    class DenseCollate(ArrowBatchCollateFn):
        """Minimal collate_fn: Ray turns fixed_size_list<int32> into object arrays."""

        def __call__(self, table):
            return {c: _dense(table.column(c)) for c in table.column_names}

    B = cfg["batch_size"]
    RSS.start()  # after the case's imports, before its loader is built
    t0 = time.perf_counter()
    ds = ray.data.read_parquet(meta["files"])
    for _ in range(cfg["epochs"]):  # each epoch streams the files again, as a trainer's does
        for batch in ds.iter_jax_batches(batch_size=B, collate_fn=DenseCollate(),
                                         drop_last=True):
            consume(batch)
    return t0


def case_grain(cfg, meta, consume, extra) -> float:
    import grain

    B = cfg["batch_size"]
    sharding = _mesh_sharding()
    RSS.start()  # after the case's imports, before its loader is built
    t0 = time.perf_counter()
    for _ in range(cfg["epochs"]):
        ds = grain.experimental.ParquetIterDataset(meta["files"])
        ds = ds.batch(B, drop_remainder=True)
        ds = grain.experimental.device_put(ds, sharding)
        for batch in ds:
            consume(batch)
    return t0


def case_slicefeed(cfg, meta, consume, extra) -> float:
    if cfg.get("loader_kwargs", {}).get("reader") == "ray":
        _ray_init(extra, cfg)  # reader="local" reads in this process: no Ray
    from slicefeed.pipelines import JaxLoader

    B = cfg["batch_size"]
    RSS.start()  # after the case's imports, before its loader is built
    t0 = time.perf_counter()
    loader = JaxLoader(
        meta["dir"], global_batch_size=B, num_epochs=cfg["epochs"], dtypes=LOADER_DTYPES,
        **cfg.get("loader_kwargs", {}),
    )
    for batch in loader:
        consume(batch)
    st = loader.stats()
    extra["memory_bound"] = memory_bound(st)
    extra["loader_stats"] = {
        k: st[k]
        for k in ("rows", "batches", "rows_decoded", "rows_decoded_peak", "host_copies",
                  "host_copy_bytes", "input_stall_s_total", "time_to_first_batch_s")
        if k in st
    }
    return t0


def case_slicefeed_ray(cfg, meta, consume, extra) -> float:
    cfg = dict(cfg, loader_kwargs={**cfg.get("loader_kwargs", {}), "reader": "ray"})
    return case_slicefeed(cfg, meta, consume, extra)


CASE_FUNCS = {name: globals()[f"case_{name.removesuffix(DEFAULT_STORE)}"] for name in CASES}


def child_main(cfg_json: str) -> None:
    cfg = json.loads(cfg_json)
    meta = cfg["meta"]
    extra: dict = {}
    t_imp = time.perf_counter()
    import jax
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401

    extra["import_s"] = time.perf_counter() - t_imp
    extra["devices"] = jax.device_count()
    consumer = Consumer(cfg["batch_size"])
    prof = None
    if cfg.get("profile"):
        from pyinstrument import Profiler

        prof = Profiler(async_mode="disabled")
        prof.start()
    t0 = CASE_FUNCS[cfg["case"]](cfg, meta, consumer, extra)
    if prof is not None:
        prof.stop()
        with open(cfg["profile"], "w") as f:
            f.write(prof.output_text(unicode=False, color=False, show_all=False))
    res = consumer.summary(t0)
    res["memory"] = {**RSS.result(), **extra.pop("memory_bound", {})}
    res.update(extra)
    res["peak_rss_mb"] = peak_rss_self_mb()
    with open(cfg["out"], "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)  # skip slow interpreter/Ray teardown; results are on disk


# =========================================================================== parent side


def run_case(case: str, batch_size: int, meta: dict, args, device_count: int = 8) -> dict:
    cfg = {"case": case, "batch_size": batch_size, "meta": meta, "epochs": args.epochs,
           "default_store": case.endswith(DEFAULT_STORE)}
    if args.profile and case in args.profile.split(","):
        cfg["profile"] = os.path.join(
            os.path.dirname(os.path.abspath(args.json)), f"profile-{case}-b{batch_size}.txt"
        )
    res, finished = run_child(__file__, cfg, process_env(device_count), args.timeout,
                              prefix=f"bench-{case}-")
    if not finished:
        return res
    expected = (meta["rows"] // batch_size) * batch_size
    problems = validate(res, meta, expected, args.epochs)
    if expected != meta["rows"]:
        problems.append(f"rows ({meta['rows']}) not a multiple of batch size {batch_size}")
    if problems:
        res["status"] = "FAILED: " + "; ".join(problems)
        res["rows_per_s"] = res["bytes_per_s"] = None
    else:
        res["status"] = "ok"
    return res


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(runs: dict[str, list[dict]]) -> tuple[dict, dict]:
    """Per-case medians over repeats; slicefeed ratios (median of per-repeat ratios)."""
    cases = {}
    keys = (
        "rows_per_s",
        "bytes_per_s",
        "wall_s",
        "time_to_first_batch_s",
        "peak_rss_mb",
        "peak_tree_rss_mb",
        "check_s",
        "ray_init_s",
        "e2e_rows_per_s",
    )
    for name, rs in runs.items():
        ok = all(r.get("status") == "ok" for r in rs)
        c = {k: _median([r.get(k) for r in rs]) for k in keys}
        c["status"] = "ok" if ok else next(r["status"] for r in rs if r.get("status") != "ok")
        c["repeats"] = len(rs)
        c["rows_per_s_runs"] = [r.get("rows_per_s") for r in rs]
        c["rows"] = rs[0].get("rows")
        c["warmup_batches"] = rs[0].get("warmup_batches")
        c["batches"] = rs[0].get("batches")
        if "loader_stats" in rs[-1]:
            c["loader_stats"] = rs[-1]["loader_stats"]
        mem = memory_summary(rs)
        if mem:
            c["memory"] = mem
        cases[name] = c
    ratios = {}
    sf = runs.get("slicefeed")
    if sf:
        for name, rs in runs.items():
            if name == "slicefeed":
                continue
            per = [
                a["rows_per_s"] / b["rows_per_s"]
                for a, b in zip(sf, rs)
                if a.get("rows_per_s") and b.get("rows_per_s")
            ]
            e2e = [
                a["e2e_rows_per_s"] / b["e2e_rows_per_s"]
                for a, b in zip(sf, rs)
                if a.get("e2e_rows_per_s") and b.get("e2e_rows_per_s")
            ]
            r = {"rows_per_s": _median(per), "runs": per, "e2e_rows_per_s": _median(e2e)}
            if name in TARGETS:
                r["target"] = TARGETS[name]
                r["met"] = bool(per) and _median(per) >= TARGETS[name] and len(per) == len(rs)
            ratios[f"slicefeed/{name}"] = r
        if "ray_iter_jax_batches" in runs:
            tt = [
                a["time_to_first_batch_s"] / b["time_to_first_batch_s"]
                for a, b in zip(sf, runs["ray_iter_jax_batches"])
                if a.get("time_to_first_batch_s") and b.get("time_to_first_batch_s")
            ]
            ratios["ttfb slicefeed/ray_iter_jax_batches"] = {
                "ratio": _median(tt),
                "runs": tt,
                "target": "<= 1.0",
                "met": bool(tt) and _median(tt) <= 1.0,
            }
    return cases, ratios


def _fmt(x, nd=0, scale=1.0):
    return "-" if x is None else f"{x / scale:,.{nd}f}"


def print_table(cases: dict, ratios: dict, batch_size: int) -> str:
    lines = [
        f"global batch size {batch_size}, {ROW_BYTES} B/row, medians over repeats",
        (f"{'case':<36}{'rows/s':>10}{'MB/s':>9}{'e2e r/s':>9}{'wall s':>8}{'TTFB s':>8}"
         f"{'RSS MB':>8}{'tree MB':>9}  status"),
    ]
    for name, c in cases.items():
        lines.append(
            f"{name:<36}{_fmt(c['rows_per_s']):>10}{_fmt(c['bytes_per_s'], 0, 1e6):>9}"
            f"{_fmt(c['e2e_rows_per_s']):>9}"
            f"{_fmt(c['wall_s'], 2):>8}{_fmt(c['time_to_first_batch_s'], 2):>8}"
            f"{_fmt(c['peak_rss_mb']):>8}{_fmt(c['peak_tree_rss_mb']):>9}  {c['status']}"
        )
    if ratios:
        lines.append("")
        lines.append(f"{'ratio (steady-state rows/s)':<40}{'median':>8}{'target':>9}  met   "
                     f"{'e2e':>5}  runs")
        for k, r in ratios.items():
            v = r.get("rows_per_s", r.get("ratio"))
            tgt = r.get("target", "")
            runs = ", ".join(f"{x:.2f}" for x in r["runs"])
            lines.append(
                f"{k:<40}{_fmt(v, 2):>8}{tgt!s:>9}  {r.get('met', '')!s:<5} "
                f"{_fmt(r.get('e2e_rows_per_s'), 2):>5}  {runs}"
            )
    lines += memory_lines(cases)
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def plot(sweep: dict[str, dict[int, float]], path: str, title: str) -> bool:
    """Writes the sweep's PNG; False (with a message) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot at {path} (the JSON has every figure); "
              "pip install 'slicefeed[benchmarks]' for it.", flush=True)
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sweep.items():
        xs = sorted(b for b, v in pts.items() if v)
        if xs:
            ax.plot(xs, [pts[b] for b in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch size (rows)")
    ax.set_ylabel("steady-state rows/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small dataset, 2 batch sizes")
    ap.add_argument("--json", help="result path (default benchmarks/results/loader[-quick].json)")
    ap.add_argument("--cases", help=f"comma-separated subset of {','.join(CASES)} (quick: {','.join(QUICK_CASES)})")
    ap.add_argument("--batch-size", type=int, default=256, help="global batch size of the table")
    ap.add_argument("--batch-sizes", help="comma-separated sweep for the plot (default 64,256,1024; quick 256,1024)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per case at --batch-size (default 3; quick 1)")
    ap.add_argument("--rows", type=int, help="dataset rows (default 32768; quick 8192)")
    ap.add_argument("--files", type=int, help="Parquet files (default 8; quick 4)")
    ap.add_argument("--row-group", type=int, default=1024, help="rows per Parquet row group")
    ap.add_argument("--epochs", type=int, help="passes over the dataset per case (default 4; quick 2)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per case process")
    ap.add_argument("--profile", default="", help="cases to profile with pyinstrument (text next to the JSON)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0

    q = args.quick
    rows = args.rows or (8192 if q else 32768)
    files = args.files or (4 if q else 8)
    repeat = args.repeat or (1 if q else 3)
    args.epochs = args.epochs or (2 if q else 4)
    sizes = [int(x) for x in (args.batch_sizes or ("256,1024" if q else "64,256,1024")).split(",")]
    args.timeout = args.timeout or (150 if q else 600)
    args.json = args.json or os.path.join(HERE, "results", "loader-quick.json" if q else "loader.json")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    cases = [c.strip() for c in (args.cases or ",".join(QUICK_CASES if q else CASES)).split(",")]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    for b in [args.batch_size] + sizes:
        if b % 8 or rows % b:
            ap.error(f"batch size {b} must divide --rows ({rows}) and be a multiple of 8 devices")

    t_all = time.perf_counter()
    machine = machine_info()
    meta = ensure_dataset(rows, files, args.row_group)
    warm_page_cache(meta["files"])
    print(
        f"dataset {meta['dir']}: {rows} rows x {ROW_BYTES} B in {files} files "
        f"({meta['file_bytes'] / 1e6:.0f} MB on disk), {args.epochs} epochs per case; "
        f"cases {cases}; repeat {repeat}; "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(repeat):
        for c in cases:  # round-robin so load changes hit every case alike
            res = run_case(c, args.batch_size, meta, args)
            runs[c].append(res)
            print(
                f"  [{r + 1}/{repeat}] {c:<22} b={args.batch_size:<5} "
                f"{_fmt(res.get('rows_per_s')):>9} rows/s  TTFB {_fmt(res.get('time_to_first_batch_s'), 2)} s"
                f"  {res['status']}",
                flush=True,
            )
            if res["status"] != "ok" and res.get("log_tail"):
                print(res["log_tail"], flush=True)
    sweep: dict[str, dict[int, float]] = {
        c: {args.batch_size: _median([x.get("rows_per_s") for x in runs[c]])} for c in cases
    }
    sweep_runs: dict[str, dict[int, dict]] = {c: {} for c in cases}
    for b in sizes:
        if b == args.batch_size:
            continue
        for c in cases:
            res = run_case(c, b, meta, args)
            sweep[c][b] = res.get("rows_per_s")
            sweep_runs[c][b] = {
                k: res.get(k) for k in ("rows_per_s", "time_to_first_batch_s", "status")
            }
            print(f"  sweep {c:<22} b={b:<5} {_fmt(res.get('rows_per_s')):>9} rows/s  {res['status']}", flush=True)

    case_summary, ratios = summarise(runs)
    machine["loadavg_end"] = os.getloadavg()
    table = print_table(case_summary, ratios, args.batch_size)
    png = os.path.splitext(args.json)[0] + ".png"
    plotted = plot(
        sweep,
        png,
        f"{rows} rows x {ROW_BYTES} B, 8 CPU devices, {machine.get('nproc')} cores "
        f"(load {machine['loadavg_start'][0]:.0f}->{machine['loadavg_end'][0]:.0f})",
    )
    doc = {
        "cases": case_summary,
        "ratios": ratios,
        "machine": machine,
        "config": {
            "rows": rows,
            "files": files,
            "row_group": args.row_group,
            "row_bytes": ROW_BYTES,
            "seq_len": SEQ_LEN,
            "file_bytes": meta["file_bytes"],
            "global_batch_size": args.batch_size,
            "repeat": repeat,
            "epochs": args.epochs,
            "batch_sizes": sizes,
            "devices": 8,
            "warmup": "first max(2, ceil(10% of batches)) batches of all epochs excluded; rate = "
            "rows after them / time from the last warm-up batch's arrival to the last batch's",
        },
        "sweep_rows_per_s": {c: {str(b): v for b, v in pts.items()} for c, pts in sweep.items()},
        "runs": runs,
        "sweep_runs": sweep_runs,
        "table": table,
        "total_s": time.perf_counter() - t_all,
    }
    for rs in runs.values():
        for r in rs:
            r.pop("log_tail", None)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    wrote = f"{args.json} and {png}" if plotted else args.json
    print(f"wrote {wrote} in {doc['total_s']:.0f} s", flush=True)
    failed = [c for c, s in case_summary.items() if s["status"] != "ok"]
    failed += [f"{c}@{b}" for c, d in sweep_runs.items() for b, r in d.items() if r["status"] != "ok"]
    if failed:
        print(f"FAILED cases: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
