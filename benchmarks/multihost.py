#!/usr/bin/env python
"""Multi-host loader benchmark: N processes x D CPU devices (default 2 x 4) joined with
``jax.distributed.initialize`` (gloo), each running ``JaxLoader`` over its share of the
same committed dataset as ``benchmarks/loader.py``. Reports per-host steady-state
throughput and the spread between hosts, and validates that the hosts together
delivered every row once (row count + token checksum summed over hosts).

With ``--reader ray`` each host starts its own local Ray instance with
``num_cpus = nproc / hosts`` (as a slice host reads with its own CPUs); the default
local reader needs no Ray. Usage::

    python benchmarks/multihost.py --quick
    python benchmarks/multihost.py --hosts 2 --devices-per-host 4 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import (
    HERE,
    LOADER_DTYPES,
    ROW_BYTES,
    Consumer,
    TreeRSSSampler,
    ensure_dataset,
    machine_info,
    peak_rss_self_mb,
    process_env,
    validate,
    warm_page_cache,
)


def host_main(cfg: dict) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cfg["coordinator"],
        num_processes=cfg["hosts"],
        process_id=cfg["host"],
        initialization_timeout=120,
    )
    import ray

    extra = {"process_index": jax.process_index(), "devices": jax.device_count(),
             "local_devices": jax.local_device_count()}
    t = time.perf_counter()
    for attempt in range(3 if cfg["reader"] == "ray" else 0):  # the local reader needs no Ray
        try:
            ray.init(address="local", num_cpus=cfg["cpus"], include_dashboard=False,
                     log_to_driver=False, object_store_memory=512 << 20)
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    extra["ray_init_s"] = time.perf_counter() - t
    from slicefeed.pipelines import JaxLoader

    consumer = Consumer(cfg["batch_size"] // cfg["hosts"])
    t0 = time.perf_counter()
    loader = JaxLoader(cfg["meta"]["dir"], global_batch_size=cfg["batch_size"], num_epochs=1,
                       reader=cfg["reader"], dtypes=LOADER_DTYPES)
    for batch in loader:
        consumer(batch)
    res = consumer.summary(t0)
    res.update(extra)
    res["steps_per_epoch"] = loader.steps_per_epoch
    res["peak_rss_mb"] = peak_rss_self_mb()
    with open(cfg["out"], "w") as f:
        json.dump(res, f)
    # Host 0 runs the coordination service: leaving before the others finish would
    # kill them. shutdown() is a barrier over all hosts.
    jax.distributed.shutdown()
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--devices-per-host", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--reader", choices=("local", "ray"), default="local",
                    help="JaxLoader reader= (ray: each host starts its own local Ray)")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--files", type=int)
    ap.add_argument("--row-group", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="default benchmarks/results/multihost[-quick].json")
    ap.add_argument("--host-config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.host_config:
        host_main(json.loads(args.host_config))
        return 0

    rows = args.rows or (8192 if args.quick else 32768)
    files = args.files or (4 if args.quick else 8)
    args.json = args.json or os.path.join(
        HERE, "results", "multihost-quick.json" if args.quick else "multihost.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    meta = ensure_dataset(rows, files, args.row_group)
    warm_page_cache(meta["files"])
    machine = machine_info()
    coord = f"127.0.0.1:{free_port()}"
    cpus = max(1, (os.cpu_count() or 2) // args.hosts)
    procs, outs = [], []
    t = time.perf_counter()
    for h in range(args.hosts):
        fd, out = tempfile.mkstemp(prefix=f"bench-host{h}-", suffix=".json")
        os.close(fd)
        outs.append(out)
        cfg = {"host": h, "hosts": args.hosts, "coordinator": coord, "cpus": cpus,
               "batch_size": args.batch_size, "meta": meta, "out": out,
               "reader": args.reader}
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--host-config", json.dumps(cfg)],
            env=process_env(args.devices_per_host), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True))
    samplers = [TreeRSSSampler(p.pid) for p in procs]
    logs, failed = [], []
    deadline = time.monotonic() + args.timeout
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, 9)
                except ProcessLookupError:
                    pass
            logs.append(p.communicate()[0])
            failed.append(f"timeout after {args.timeout} s")
    tree = [s.stop() for s in samplers]
    for p in procs:
        try:
            os.killpg(p.pid, 9)  # Ray processes each host started
        except ProcessLookupError:
            pass
    hosts = []
    for h, (out, log) in enumerate(zip(outs, logs)):
        try:
            with open(out) as f:
                r = json.load(f)
        except (OSError, json.JSONDecodeError):
            r = {"status": "FAILED: no result", "log_tail": log[-3000:]}
            failed.append(f"host {h}: no result")
            print(log[-3000:])
        finally:
            if os.path.exists(out):
                os.unlink(out)
        r["peak_tree_rss_mb"] = tree[h]
        hosts.append(r)
    total = {
        "rows": sum(h.get("rows") or 0 for h in hosts),
        "token_sum": sum(h.get("token_sum") or 0 for h in hosts),
        "token_count": sum(h.get("token_count") or 0 for h in hosts),
        "doc_id_sum": sum(h.get("doc_id_sum") or 0 for h in hosts),
        "errors": [e for h in hosts for e in (h.get("errors") or [])],
    }
    expected = (rows // args.batch_size) * args.batch_size
    problems = failed + validate(total, meta, expected)
    steps = {h.get("batches") for h in hosts}
    if len(steps) != 1:
        problems.append(f"hosts took different numbers of steps: {sorted(map(str, steps))}")
    rates = [h.get("rows_per_s") for h in hosts]
    ok_rates = [r for r in rates if r]
    summary = {
        "status": "ok" if not problems else "FAILED: " + "; ".join(problems),
        "per_host_rows_per_s": rates,
        "aggregate_rows_per_s": sum(ok_rates) if len(ok_rates) == len(hosts) else None,
        "spread": ((max(ok_rates) - min(ok_rates)) / statistics.mean(ok_rates))
        if len(ok_rates) == len(hosts) else None,
        "per_host_ttfb_s": [h.get("time_to_first_batch_s") for h in hosts],
        "per_host_wall_s": [h.get("wall_s") for h in hosts],
        "wall_s": time.perf_counter() - t,
    }
    machine["loadavg_end"] = os.getloadavg()
    print(f"{args.hosts} hosts x {args.devices_per_host} CPU devices, global batch "
          f"{args.batch_size}, {rows} rows x {ROW_BYTES} B")
    print(f"{'host':<6}{'rows':>8}{'rows/s':>10}{'MB/s':>8}{'TTFB s':>8}{'wall s':>8}{'RSS MB':>8}")
    for i, h in enumerate(hosts):
        rps = h.get("rows_per_s")
        print(f"{i:<6}{h.get('rows', 0):>8}{(rps or 0):>10,.0f}{(rps or 0) * ROW_BYTES / 1e6:>8.0f}"
              f"{(h.get('time_to_first_batch_s') or 0):>8.2f}{(h.get('wall_s') or 0):>8.2f}"
              f"{(h.get('peak_rss_mb') or 0):>8.0f}")
    if summary["spread"] is not None:
        print(f"aggregate {summary['aggregate_rows_per_s']:,.0f} rows/s, spread "
              f"(max-min)/mean = {summary['spread']:.1%}")
    print(summary["status"])
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "hosts": hosts, "machine": machine,
                   "config": {"rows": rows, "files": files, "hosts": args.hosts,
                              "devices_per_host": args.devices_per_host,
                              "global_batch_size": args.batch_size, "cpus_per_host": cpus,
                              "reader": args.reader}},
                  f, indent=1, default=str)
    print(f"wrote {args.json}")
    return 0 if summary["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
