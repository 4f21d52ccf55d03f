#!/usr/bin/env python
"""Streaming-path benchmark: a Ray Data pipeline on Ray CPU workers (the ``text_lm``
recipe: JSONL -> tokenize -> pack to 2048) consumed by 2 loader processes x 4 CPU
devices, as ``JaxTrainer`` workers consume it: the driver calls
``ds.streaming_split(2, equal=True)`` and hands one ``DataIterator`` to each of two
Ray actors that join with ``jax.distributed.initialize`` (gloo).

Cases (same pipeline, same split, same consumer):

- ``slicefeed``: ``JaxLoader(it, global_batch_size=B)`` in each host.
- ``ray``: Ray's plain ``it.iter_jax_batches(batch_size=B // hosts, ...)``.
- ``slicefeed_prev``: ``slicefeed`` with the loader's previous per-step agreement
  (one key-value exchange per step) patched back in (a before/after in one run).
- ``slicefeed_prefetch0`` (only with ``--cases``): ``JaxLoader(..., prefetch=0)``,
  producing each batch in the consumer's thread as Ray does.
- ``slicefeed_noexchange`` (only with ``--cases``; diagnostic): the key-value
  exchange replaced by each host's own report (valid only because this corpus
  gives every host the same full batches): what the exchange costs.
- ``floor`` (only with ``--cases``; diagnostic): no loader in the timed loop.
  Each host first reads its whole share (Ray's ``iter_batches``) and puts every
  batch on its devices, then the clock starts and the same consumer loop (wait,
  checksum, cross-host step) runs over those arrays: the most rows/s, and the
  least trainer CPU per row, any loader could reach in this loop.

Modes: ``producer`` (the live pipeline: the Ray producer is the bottleneck) and
``consumer`` (the same pipeline's output ``materialize()``-d first, then split).
Every step ends with a tiny cross-host reduction of the batch (a barrier, as an
SPMD training step has). Reported per host: steady rows/s, time to first batch,
CPU seconds of the trainer process per row, input-stall time (waiting for the
next batch) and its spread between hosts. Validation: the hosts together
received every row once (row count, token sum and count against values computed
from the generated JSONL) in equal steps. Usage::

    python benchmarks/streaming.py --quick
    python benchmarks/streaming.py --rows 16384 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import DATA_DIR, HERE, machine_info, process_env

SEQ_LEN = 2048
COLUMNS = ("tokens", "segment_ids", "positions")
ROW_BYTES = SEQ_LEN * 4 * len(COLUMNS)
# Document sizes in tokens (bytes + EOS). They divide SEQ_LEN, so best-fit
# decreasing packs every file's documents into full rows: the row count and the
# token checksum are known from the generated text alone.
DOC_TOKENS = (256, 512, 1024, 2048)
CASES = ("slicefeed", "ray", "slicefeed_prev", "slicefeed_prefetch0", "slicefeed_noexchange",
         "floor")
DEFAULT_CASES = CASES[:3]
PAIRS = ("slicefeed/ray", "slicefeed/slicefeed_prev", "slicefeed_prev/ray",
         "slicefeed_prefetch0/ray", "slicefeed_prefetch0/slicefeed",
         "slicefeed_noexchange/ray", "slicefeed_noexchange/slicefeed", "floor/ray",
         "slicefeed/floor")
MODES = ("producer", "consumer")
# Packing is per block, so the exact row count above holds only while each file is
# one block of Ray's JSON reader: 512 rows (about 1 MB of text) per file is; 2,048
# rows per file was split and packed into 16,397 rows instead of 16,384.
ROWS_PER_FILE = 512


# --------------------------------------------------------------------------- corpus


def ensure_corpus(rows: int, files: int, *, log=print) -> dict:
    """Writes (once) ``files`` JSONL files of ASCII documents that pack into exactly
    ``rows`` rows of SEQ_LEN tokens; returns the expected checksums."""
    import numpy as np

    if rows % files:
        raise SystemExit(f"--rows ({rows}) must be a multiple of --files ({files}).")
    d = os.path.join(DATA_DIR, f"jsonl-r{rows}-f{files}")
    meta_path = os.path.join(d, "bench_meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            return json.load(f)
    os.makedirs(os.path.join(d, "corpus"), exist_ok=True)
    t0 = time.perf_counter()
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ,.ETAOIN", dtype=np.uint8)
    tok_sum = docs = 0
    for i in range(files):
        rng = np.random.default_rng([4321, i])
        budget = rows // files * SEQ_LEN
        with open(os.path.join(d, "corpus", f"docs-{i:04d}.jsonl"), "w") as out:
            while budget:
                n = int(rng.choice([t for t in DOC_TOKENS if t <= budget]))
                text = alphabet[rng.integers(0, len(alphabet), n - 1)]
                # byte tokenizer: b -> b + 3, EOS = 2
                tok_sum += int(text.sum(dtype=np.int64)) + 3 * (n - 1) + 2
                out.write(json.dumps({"text": text.tobytes().decode(), "id": docs}) + "\n")
                docs += 1
                budget -= n
    meta = {"dir": d, "corpus": os.path.join(d, "corpus"), "rows": rows, "files": files,
            "docs": docs, "token_sum": tok_sum, "token_count": rows * SEQ_LEN}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    log(f"wrote {d} ({docs} documents) in {time.perf_counter() - t0:.1f} s")
    return meta


def pipeline_dataset(meta: dict):
    """The ``text_lm`` recipe's lazy Dataset over the generated corpus."""
    from slicefeed.pipelines import load_pipeline, recipe_path

    p = load_pipeline(recipe_path("text_lm"), [
        f"source.uri={meta['corpus']}", f"sink.uri={os.path.join(meta['dir'], 'unused-sink')}"])
    return p.dataset()


# --------------------------------------------------------------------------- one host


def _dense(col):
    """Arrow column -> dense NumPy (fixed_size_list or a fixed-shape tensor extension,
    whose storage is one, -> (n, d) view of the values)."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if isinstance(col, pa.ExtensionArray):
        col = col.storage
    if pa.types.is_fixed_size_list(col.type):
        n = len(col)
        return col.flatten().to_numpy(zero_copy_only=True).reshape(n, col.type.list_size)
    return col.to_numpy(zero_copy_only=True)


def _patch_previous_loader() -> None:
    """The ``slicefeed_prev`` case: JaxLoader with its previous agreement for an
    unknown row count (one key-value exchange of each step's full / partial / none
    status: a set, a server-side wait and a delete per step), for a before/after in
    one run against the agreement per group of steps."""
    from slicefeed.pipelines._loader import _produce

    def agreed_epoch_prev(self, tables, epoch, start):
        lb, step = self.lb, start
        it = iter(tables)
        pending = next(it, None)
        while True:
            status = 0 if pending is None else 2 if pending.num_rows == lb else 1
            statuses = [int(v) for v in
                        self.agreement.exchange(f"e{epoch}/s{step}", str(status), self.ctx.stop)]
            self.stats.add(agreements=1)
            if step >= 2:
                self.agreement.forget(f"e{epoch}/s{step - 2}")
            if self.remainder == "drop":
                if min(statuses) < 2:
                    left = pending.num_rows if pending is not None else 0
                    for t in it:
                        left += t.num_rows
                    self.stats.add(dropped_rows=left)
                    return
            elif max(statuses) == 0:
                return
            if pending is None:
                yield self._emit(self._filler(), epoch, step, 0)
            else:
                batch = self.placement.to_global(self._host(pending, epoch, step * lb, self.ctx))
                yield self._emit(batch, epoch, step, pending.num_rows)
                pending = next(it, None)
            step += 1

    _produce.Producer._agreed_epoch = agreed_epoch_prev


def host_run(cfg: dict, it) -> dict:
    """One trainer process: joins the JAX job, consumes its DataIterator, reports."""
    import resource

    import jax
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=cfg["coordinator"],
                               num_processes=cfg["hosts"], process_id=cfg["host"],
                               initialization_timeout=300)
    import jax.numpy as jnp
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    B, lb = cfg["batch_size"], cfg["batch_size"] // cfg["hosts"]
    step_fn = jax.jit(lambda t: jnp.sum(t[:, 0]))  # a cross-host reduction: the barrier
    # Compiled before the clock starts, on the 1-D "data" mesh both cases shard over.
    mesh = Mesh(mesh_utils.create_device_mesh((jax.device_count(),)), ("data",))
    step_fn(jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), np.zeros((lb, SEQ_LEN), np.int32),
        (B, SEQ_LEN))).block_until_ready()

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    res = {"host": cfg["host"], "process_index": jax.process_index(),
           "devices": jax.device_count(), "local_devices": jax.local_device_count()}
    times, stalls, rows, cpus = [], [], [], []
    tok_sum = tok_count = 0
    errors: list[str] = []
    loader = None
    if cfg["case"] == "floor":
        # Every batch on the devices before the clock starts (not timed).
        sharding = NamedSharding(mesh, PartitionSpec("data"))
        ready = [{c: jax.make_array_from_process_local_data(sharding, _dense(t.column(c)),
                                                            (B,) + (SEQ_LEN,))
                  for c in t.column_names}
                 for t in it.iter_batches(batch_size=lb, batch_format="pyarrow",
                                          drop_last=True)]
        jax.block_until_ready(ready)
    cpu0, t0 = cpu(), time.perf_counter()
    if cfg["case"] == "floor":
        batches = iter(ready)
        del ready
    elif cfg["case"].startswith("slicefeed"):
        from slicefeed.pipelines import JaxLoader

        if cfg["case"] == "slicefeed_prev":
            _patch_previous_loader()
        if cfg["case"] == "slicefeed_noexchange":
            # Diagnostic only: this corpus gives every host the same full batches, so
            # each host's own report is every host's; what the exchange costs.
            from slicefeed.pipelines._loader import _agree

            _agree.Agreement.exchange = lambda self, tag, value, stop=None: (
                [value] * self.process_count)

        loader = JaxLoader(it, global_batch_size=B,
                           prefetch=0 if cfg["case"] == "slicefeed_prefetch0" else 2)
        res["construct_s"] = time.perf_counter() - t0
        batches = iter(loader)
    else:
        from ray.data.collate_fn import ArrowBatchCollateFn

        class DenseCollate(ArrowBatchCollateFn):
            """Minimal collate_fn: Ray turns fixed_size_list<int32> into object arrays."""

            def __call__(self, table):
                return {c: _dense(table.column(c)) for c in table.column_names}

        batches = iter(it.iter_jax_batches(batch_size=lb, collate_fn=DenseCollate(),
                                           drop_last=True))
    barrier_s = 0.0
    while True:
        t = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        jax.block_until_ready(batch)
        now = time.perf_counter()
        stalls.append(now - t)
        times.append(now)
        tok = batch.get("tokens") if isinstance(batch, dict) else None
        if tok is None or tuple(tok.shape) != (B, SEQ_LEN) or tok.dtype != np.int32:
            errors.append(f"bad batch: {type(batch).__name__} tokens "
                          f"{getattr(tok, 'shape', None)} {getattr(tok, 'dtype', None)}")
            break
        if sorted(batch) != sorted(COLUMNS):
            errors.append(f"batch columns {sorted(batch)} != {sorted(COLUMNS)}")
        n = 0
        for s in tok.addressable_shards:
            a = np.asarray(s.data)
            tok_sum += int(a.sum(dtype=np.int64))
            tok_count += a.size
            n += len(a)
        rows.append(n)
        tb = time.perf_counter()
        step_fn(tok).block_until_ready()
        barrier_s += time.perf_counter() - tb
        cpus.append(cpu())
    cpu1 = cpu()
    n = len(times)
    w = max(2, -(-n // 10))  # warm-up batches, as benchmarks/_benchlib.Consumer
    res.update({
        "batches": n, "rows": sum(rows), "token_sum": tok_sum, "token_count": tok_count,
        "errors": errors[:5],
        "time_to_first_batch_s": times[0] - t0 if n else None,
        "wall_s": times[-1] - t0 if n else None,
        "cpu_s": cpu1 - cpu0,
        "cpu_us_per_row_total": (cpu1 - cpu0) / max(sum(rows), 1) * 1e6,
        # steady state: after the warm-up batches, as rows/s
        "cpu_us_per_row": ((cpus[-1] - cpus[w - 1]) / sum(rows[w:]) * 1e6) if n > w else None,
        # input stall: time next() took (and the batch's transfer), after the first batch
        "stall_s": sum(stalls[1:]),
        "barrier_s": barrier_s,
        "rows_per_s": (sum(rows[w:]) / (times[-1] - times[w - 1])) if n > w else None,
    })
    if loader is not None:
        res["loader_stats"] = loader.stats()
    jax.distributed.shutdown()  # a barrier: host 0 runs the coordination service
    return res


# --------------------------------------------------------------------------- driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_profiles(pids: list[int], prefix: str) -> list:
    """py-spy (sampling, every thread, idle time left out) on each trainer process."""
    import shutil
    import subprocess

    exe = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not exe:
        print("--profile: py-spy not found (pip install py-spy, or set PY_SPY)", flush=True)
        return []
    return [subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "200", "--format",
                              "raw", "--nonblocking", "-o", f"{prefix}-host{h}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for h, pid in enumerate(pids)]


def run_case(case: str, ds, cfg: dict, meta: dict, Host, profile: str | None = None) -> dict:
    import signal

    import ray

    t = time.perf_counter()
    its = ds.streaming_split(cfg["hosts"], equal=True)
    coord = f"127.0.0.1:{free_port()}"
    actors = [Host.remote() for _ in range(cfg["hosts"])]
    spies = []
    try:
        pids = ray.get([a.ready.remote() for a in actors], timeout=cfg["timeout"])  # imports
        if profile:
            spies = _start_profiles(pids, profile)
            time.sleep(1)  # py-spy attaches
        refs = [a.run.remote({**cfg, "case": case, "host": h, "coordinator": coord}, its[h])
                for h, a in enumerate(actors)]
        hosts = ray.get(refs, timeout=cfg["timeout"])
        failed = []
    except Exception as e:  # noqa: BLE001 - reported as a failed case
        hosts, failed = [], [f"{type(e).__name__}: {str(e)[:500]}"]
    finally:
        for p in spies:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=60)
        for a in actors:
            ray.kill(a)
    problems = failed + [e for h in hosts for e in h["errors"]]
    if hosts:
        rows = sum(h["rows"] for h in hosts)
        if rows != meta["rows"]:
            problems.append(f"hosts delivered {rows} rows together, expected {meta['rows']}")
        ts = sum(h["token_sum"] for h in hosts)
        tc = sum(h["token_count"] for h in hosts)
        if (ts, tc) != (meta["token_sum"], meta["token_count"]):
            problems.append(f"token checksum {ts}/{tc} != expected "
                            f"{meta['token_sum']}/{meta['token_count']}")
        if len({h["batches"] for h in hosts}) != 1:
            problems.append(f"hosts took different step counts {[h['batches'] for h in hosts]}")
    out = {"case": case, "status": "ok" if not problems else "FAILED: " + "; ".join(problems),
           "hosts": hosts, "case_wall_s": time.perf_counter() - t}
    if hosts and not problems:
        rates = [h["rows_per_s"] for h in hosts]
        stalls = [h["stall_s"] for h in hosts]
        out.update({
            "per_host_rows_per_s": rates,
            "rows_per_s": statistics.mean(rates) if all(rates) else None,
            "rate_spread": (max(rates) - min(rates)) / statistics.mean(rates)
            if all(rates) else None,
            "ttfb_s": max(h["time_to_first_batch_s"] for h in hosts),
            "cpu_us_per_row": statistics.mean(h["cpu_us_per_row"] for h in hosts)
            if all(h["cpu_us_per_row"] for h in hosts) else None,
            "cpu_us_per_row_total": statistics.mean(h["cpu_us_per_row_total"] for h in hosts),
            "per_host_stall_s": stalls,
            "stall_spread": (max(stalls) - min(stalls)) / statistics.mean(stalls)
            if statistics.mean(stalls) > 0 else 0.0,
        })
    return out


TARGETS = [
    # (mode, metric, comparison, target, description)
    ("producer", "rows_per_s", ">=", 0.95, "per-host rows/s >= 0.95x Ray's"),
    ("producer", "cpu_us_per_row", "<=", 0.67, "trainer CPU per row <= 0.67x Ray's"),
    ("producer", "cpu_us_per_row_total", "<=", None, "trainer CPU per row incl. start"),
    ("producer", "ttfb_s", "<=", 1.0, "time to first batch <= Ray's"),
    ("consumer", "rows_per_s", ">=", 1.5, "per-host rows/s >= 1.5x Ray's"),
    ("consumer", "cpu_us_per_row", "<=", None, "trainer CPU per row (no target)"),
    ("consumer", "ttfb_s", "<=", 1.0, "time to first batch <= Ray's"),
]


def _plot(doc: dict, png: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (metric, label) in zip(axes, [("rows_per_s", "per-host rows/s"),
                                         ("cpu_us_per_row", "trainer CPU µs/row"),
                                         ("ttfb_s", "time to first batch (s)")]):
        xs = range(len(MODES))
        cases = list(doc["medians"].get(MODES[0], doc["medians"].get(MODES[1], {})))
        wd = 0.8 / max(len(cases), 1)
        for k, case in enumerate(cases):
            vals = [doc["medians"].get(m, {}).get(case, {}).get(metric) or 0 for m in MODES]
            ax.bar([x + wd * k for x in xs], vals, width=wd, label=case)
        ax.set_xticks([x + 0.4 - wd / 2 for x in xs], [f"{m}-bound" for m in MODES])
        ax.set_title(label)
    axes[0].legend()
    fig.suptitle(f"streaming path: {doc['config']['hosts']} hosts x "
                 f"{doc['config']['devices_per_host']} CPU devices, global batch "
                 f"{doc['config']['global_batch_size']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--devices-per-host", type=int, default=4)
    ap.add_argument("--batch-size", type=int, help="global batch (default 256, quick 128)")
    ap.add_argument("--rows", type=int, help="packed rows (default 16384, quick 4096)")
    ap.add_argument("--files", type=int,
                    help=f"JSONL files (default: one per {ROWS_PER_FILE} packed rows)")
    ap.add_argument("--repeat", type=int, help="default 3, quick 1")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help=f"of {','.join(CASES)}")
    ap.add_argument("--ray-cpus", type=int, help="Ray CPUs for the pipeline (default nproc)")
    ap.add_argument("--object-store-mb", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", help="default benchmarks/results/streaming[-quick].json")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy each trainer process; collapsed stacks next to the JSON")
    args = ap.parse_args(argv)
    rows = args.rows or (4096 if args.quick else 16384)
    B = args.batch_size or (128 if args.quick else 256)
    repeat = args.repeat or (1 if args.quick else 3)
    modes = [m for m in args.modes.split(",") if m]
    cases = tuple(c for c in args.cases.split(",") if c)
    if set(cases) - set(CASES):
        raise SystemExit(f"--cases: unknown {sorted(set(cases) - set(CASES))}; known {CASES}")
    if rows % B:
        raise SystemExit(f"--rows ({rows}) must be a multiple of the global batch ({B}).")
    if B % (args.hosts * args.devices_per_host):
        raise SystemExit(f"global batch {B} must divide over {args.hosts} x "
                         f"{args.devices_per_host} devices.")
    args.json = args.json or os.path.join(
        HERE, "results", "streaming-quick.json" if args.quick else "streaming.json")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    os.environ.update(process_env(args.devices_per_host))  # inherited by the Ray workers
    if args.files is None:
        args.files = max(1, rows // ROWS_PER_FILE)
    meta = ensure_corpus(rows, args.files)
    machine = machine_info()
    t_all = time.perf_counter()

    import ray

    ray.init(address="local", num_cpus=args.ray_cpus or os.cpu_count() or 2,
             object_store_memory=args.object_store_mb << 20, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False

    # num_cpus=0: the trainer processes hold no Ray CPU, as on a slice where the
    # pipeline runs on separate CPU nodes; they share this machine's cores.
    @ray.remote(num_cpus=0)
    class Host:
        def ready(self):
            # Imports before the clock starts (a trainer has them loaded).
            import jax.numpy  # noqa: F401
            import ray.data
            import ray.data.collate_fn  # noqa: F401

            from slicefeed.pipelines import JaxLoader  # noqa: F401
            return os.getpid()

        def run(self, cfg, it):
            return host_run(cfg, it)

    # Warm-up (Ray's worker pool, imports) and a check of the corpus: the recipe packs
    # it into exactly the expected rows, so every case can be validated row for row.
    t = time.perf_counter()
    warm = pipeline_dataset(meta).materialize()
    if warm.count() != meta["rows"]:
        raise SystemExit(f"the pipeline packed {warm.count()} rows, expected {meta['rows']}")
    del warm
    ray.get([h.ready.remote() for h in [Host.remote(), Host.remote()]])
    print(f"warm-up (pipeline materialised once, {rows} rows) {time.perf_counter() - t:.1f} s",
          flush=True)
    cfg = {"hosts": args.hosts, "batch_size": B, "timeout": args.timeout}
    # One untimed live case: the first case after start-up paid ~0.5 s more time to
    # first batch than the same case later in the run, whichever case it was.
    t = time.perf_counter()
    out = run_case("ray", pipeline_dataset(meta), cfg, meta, Host)
    print(f"warm-up case ({out['status'][:200]}) {time.perf_counter() - t:.1f} s", flush=True)
    runs: dict = {m: {c: [] for c in cases} for m in modes}
    mat_s = []
    for r in range(repeat):
        for mode in modes:
            if mode == "consumer":
                t = time.perf_counter()
                ds = pipeline_dataset(meta).materialize()
                mat_s.append(time.perf_counter() - t)
            for case in cases if r % 2 == 0 else cases[::-1]:
                if mode == "producer":
                    ds = pipeline_dataset(meta)  # a fresh execution per case
                prof = (os.path.splitext(args.json)[0] + f"-profile-{mode}-{case}-r{r}"
                        if args.profile else None)
                out = run_case(case, ds, cfg, meta, Host, prof)
                runs[mode][case].append(out)
                print(f"[{r + 1}/{repeat}] {mode:<8} {case:<9} {out['status'][:300]} "
                      f"rows/s {out.get('per_host_rows_per_s')} ttfb {out.get('ttfb_s')} "
                      f"cpu us/row {out.get('cpu_us_per_row')} stall "
                      f"{out.get('per_host_stall_s')} ({out['case_wall_s']:.1f} s)", flush=True)
            if mode == "consumer":
                del ds
    ray.shutdown()

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    medians: dict = {}
    ratios: dict = {}
    for mode in modes:
        medians[mode] = {}
        for case in cases:
            ok = [o for o in runs[mode][case] if o["status"] == "ok"]
            medians[mode][case] = {k: med([o.get(k) for o in ok]) for k in
                                   ("rows_per_s", "cpu_us_per_row", "cpu_us_per_row_total",
                                    "ttfb_s", "stall_spread", "rate_spread")}
            medians[mode][case]["runs_ok"] = f"{len(ok)}/{len(runs[mode][case])}"
        # ratios per repeat (a / b in the same repeat), then the median
        ratios[mode] = {}
        for pair in PAIRS:
            a_case, b_case = pair.split("/")
            if a_case not in cases or b_case not in cases:
                continue
            ratios[mode][pair] = {}
            for metric in ("rows_per_s", "cpu_us_per_row", "cpu_us_per_row_total", "ttfb_s"):
                per = []
                for a, b in zip(runs[mode][a_case], runs[mode][b_case]):
                    if a.get(metric) and b.get(metric):
                        per.append(a[metric] / b[metric])
                ratios[mode][pair][metric] = {"median": med(per), "runs": per}
    targets = []
    for mode, metric, cmp, target, what in TARGETS:
        if "slicefeed/ray" not in ratios.get(mode, {}):
            continue
        v = ratios[mode]["slicefeed/ray"][metric]["median"]
        met = None if v is None or target is None else (v >= target if cmp == ">=" else v <= target)
        targets.append({"mode": mode, "metric": metric, "ratio": v, "target": target,
                        "cmp": cmp, "met": met, "what": what})
    for mode in modes if "slicefeed" in cases else ():
        s = medians[mode]["slicefeed"]["stall_spread"]
        targets.append({"mode": mode, "metric": "stall_spread (slicefeed)", "ratio": s,
                        "target": 0.15, "cmp": "<=", "met": None if s is None else s <= 0.15,
                        "what": "per-host input-stall spread (max-min)/mean <= 15%"})
    failed = [f"{m}/{c}: {o['status']}" for m in modes for c in cases for o in runs[m][c]
              if o["status"] != "ok"]
    machine["loadavg_end"] = os.getloadavg()
    doc = {"status": "ok" if not failed else "FAILED", "failures": failed,
           "medians": medians, "ratios": ratios, "targets": targets, "runs": runs,
           "materialize_s": mat_s, "machine": machine, "total_s": time.perf_counter() - t_all,
           "config": {"rows": rows, "files": args.files, "docs": meta["docs"], "hosts": args.hosts,
                      "devices_per_host": args.devices_per_host, "global_batch_size": B,
                      "repeat": repeat, "ray_cpus": args.ray_cpus or os.cpu_count(),
                      "object_store_mb": args.object_store_mb, "row_bytes": ROW_BYTES}}
    print(f"\n{args.hosts} hosts x {args.devices_per_host} CPU devices, global batch {B}, "
          f"{rows} packed rows x {ROW_BYTES} B, medians of {repeat}")
    print(f"{'mode':<10}{'case':<11}{'rows/s/host':>12}{'CPU us/row':>12}{'(total)':>9}"
          f"{'TTFB s':>8}"
          f"{'stall spr':>10}{'rate spr':>10}  ok")
    for mode in modes:
        for case in cases:
            m = medians[mode][case]

            def f(x, fmt):
                return format(x, fmt) if x is not None else "-"
            print(f"{mode:<10}{case:<11}{f(m['rows_per_s'], ',.0f'):>12}"
                  f"{f(m['cpu_us_per_row'], ',.0f'):>12}{f(m['cpu_us_per_row_total'], ',.0f'):>9}"
                  f"{f(m['ttfb_s'], '.2f'):>8}"
                  f"{f(m['stall_spread'], '.0%'):>10}{f(m['rate_spread'], '.0%'):>10}"
                  f"  {m['runs_ok']}")
    print(f"\n{'target':<58}{'value':>8}{'goal':>8}  met")
    for t in targets:
        v = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        goal = "-" if t["target"] is None else f"{t['cmp']}{t['target']}"
        print(f"{t['mode'] + ': ' + t['what']:<58}{v:>8}{goal:>8}  {t['met']}")
    print(f"\n{'ratio (median of per-repeat ratios)':<40}{'rows/s':>8}{'CPU/row':>9}{'TTFB':>7}")
    for mode in modes:
        for pair, r in ratios[mode].items():
            vals = [r[k]["median"] for k in ("rows_per_s", "cpu_us_per_row", "ttfb_s")]
            print(f"{mode + ': ' + pair:<40}" + "".join(
                f"{'-' if v is None else format(v, '.2f'):>{w}}" for v, w in zip(vals, (8, 9, 7))))
    for x in failed:
        print(x[:500])
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    png = os.path.splitext(args.json)[0] + ".png"
    _plot(doc, png)
    print(f"wrote {args.json} (+ {os.path.basename(png)} if matplotlib) in {doc['total_s']:.0f} s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
