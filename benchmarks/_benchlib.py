"""Shared pieces of the loader benchmarks: dataset, environment, consumer, validation.

Not part of the installed package: benchmarks live outside it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "_data")

SEQ_LEN = 2048
VOCAB = 50257
# tokens (fixed_size_list<int32>[2048]) + doc_id int64 + length int32 + loss_weight float32
ROW_BYTES = SEQ_LEN * 4 + 8 + 4 + 4
COLUMNS = ("tokens", "doc_id", "length", "loss_weight")
# JAX without x64 refuses the int64 doc_id unless it is cast (range-checked) to 32 bits.
LOADER_DTYPES = {"doc_id": "int32"}


def process_env(device_count: int = 8) -> dict[str, str]:
    """Environment for benchmark child processes (set before jax/ray import)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={device_count}"
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth (docs/architecture.md)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    env.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # On a loaded machine a Ray worker can take > 60 s to import and register;
    # the raylet then kills and restarts it forever. Same setting for every Ray case.
    env.setdefault("RAY_worker_register_timeout_seconds", "600")
    # Ray starts its workers at niceness 15; on a machine shared with other work they
    # then starve while in-process readers (raw_jax, grain, slicefeed's local reader)
    # run at 0. Same priority for every case.
    env.setdefault("RAY_worker_niceness", "0")
    return env


# --------------------------------------------------------------------------- dataset


def dataset_dir(rows: int, files: int, row_group: int) -> str:
    return os.path.join(DATA_DIR, f"lm-r{rows}-f{files}-g{row_group}")


def ensure_dataset(rows: int, files: int, row_group: int, *, log=print) -> dict:
    """Writes (once) ``files`` Parquet files of LM rows plus a slicefeed manifest over them.

    Returns the dataset description: dir, files, rows, expected checksums, bytes.
    The same Parquet files are read by every case; the manifest version makes
    the directory a committed slicefeed dataset (JaxLoader reads it by URI).
    """
    import hashlib

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = dataset_dir(rows, files, row_group)
    meta_path = os.path.join(d, "bench_meta.json")
    if os.path.exists(meta_path) and (
        os.path.exists(os.path.join(d, "_manifest.json"))
        or os.path.isdir(os.path.join(d, "_versions"))):
        with open(meta_path) as f:
            return json.load(f)
    if rows % files:
        raise SystemExit(f"--rows ({rows}) must be a multiple of --files ({files}).")
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    per_file = rows // files
    schema = pa.schema(
        [
            ("tokens", pa.list_(pa.int32(), SEQ_LEN)),
            ("doc_id", pa.int64()),
            ("length", pa.int32()),
            ("loss_weight", pa.float32()),
        ]
    )
    tok_sum = 0
    doc_sum = 0
    manifest_files = []
    paths = []
    for i in range(files):
        rng = np.random.default_rng([1234, i])
        # Uniform ids below a GPT-2-sized vocabulary (high bytes zero, as in real data).
        toks = rng.integers(0, VOCAB, size=(per_file, SEQ_LEN), dtype=np.int32)
        doc = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        length = rng.integers(1, SEQ_LEN + 1, per_file, dtype=np.int32)
        weight = rng.random(per_file, dtype=np.float32)
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(toks.reshape(-1)), SEQ_LEN)
        table = pa.table(
            [tokens, pa.array(doc), pa.array(length), pa.array(weight)], schema=schema
        )
        name = f"part-{i:05d}.parquet"
        path = os.path.join(d, name)
        pq.write_table(table, path, row_group_size=row_group)
        tok_sum += int(toks.sum(dtype=np.int64))
        doc_sum += int(doc.sum())
        with open(path, "rb") as f:
            data = f.read()
        manifest_files.append((name, per_file, len(data), hashlib.sha256(data).hexdigest()))
        paths.append(path)
    from slicefeed.connectors import Manifest, ManifestFile
    from slicefeed.connectors._manifest import version_name

    m = Manifest(
        files=tuple(ManifestFile(*x) for x in manifest_files),
        schema=schema,
        metadata={"generator": "benchmarks/_benchlib.py"},
        version=1,
        writer="benchmark",
    )
    os.makedirs(os.path.join(d, "_versions"), exist_ok=True)
    with open(os.path.join(d, version_name(1)), "w") as f:
        f.write(m.to_json())
    meta = {
        "dir": d,
        "files": paths,
        "rows": rows,
        "row_group": row_group,
        "row_bytes": ROW_BYTES,
        "file_bytes": sum(x[2] for x in manifest_files),
        "token_sum": tok_sum,
        "token_count": rows * SEQ_LEN,
        "doc_id_sum": doc_sum,
    }
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    log(f"wrote {d} ({meta['file_bytes'] / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return meta


def warm_page_cache(paths: Iterable[str]) -> None:
    """Reads every file once so no case pays the cold-disk read alone."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


# --------------------------------------------------------------------------- consuming


class Consumer:
    """Consumes batches like a training loop: waits for each batch to be ready, then
    checksums what this host received (tokens: int64 sum and count; doc_id sum).

    JAX arrays are checked per addressable shard (a NumPy view of the device
    buffer on CPU, no gather), so every case pays the same per-byte cost.
    """

    def __init__(self, batch_rows: int):
        self.batch_rows = batch_rows
        self.times: list[float] = []
        self.rows: list[int] = []
        self.tok_sum = 0
        self.tok_count = 0
        self.doc_sum = 0
        self.check_s = 0.0
        self.errors: list[str] = []

    def _sum(self, a, key: str):
        import numpy as np

        if isinstance(a, np.ndarray):
            parts = [a]
        else:
            parts = [np.asarray(s.data) for s in a.addressable_shards]
        total = 0
        count = 0
        for p in parts:
            total += int(p.sum(dtype=np.int64))
            count += p.size
        return total, count, sum(len(p) for p in parts)

    def __call__(self, batch: dict[str, Any]) -> None:
        import numpy as np

        if not isinstance(batch, dict) or "tokens" not in batch:
            self.errors.append(f"batch is not a dict with 'tokens': {type(batch).__name__}")
            return
        tok = batch["tokens"]
        if not isinstance(tok, np.ndarray):
            import jax

            jax.block_until_ready(batch)
        t = time.perf_counter()
        if tuple(tok.shape[1:]) != (SEQ_LEN,) or np.dtype(tok.dtype) != np.int32:
            self.errors.append(f"tokens has shape {tok.shape} dtype {tok.dtype}")
        missing = [c for c in COLUMNS if c not in batch]
        if missing:
            self.errors.append(f"batch lacks columns {missing}")
        s, c, local_rows = self._sum(tok, "tokens")
        d, _, _ = self._sum(batch["doc_id"], "doc_id") if "doc_id" in batch else (0, 0, 0)
        self.tok_sum += s
        self.tok_count += c
        self.doc_sum += d
        self.rows.append(local_rows)
        now = time.perf_counter()
        self.check_s += now - t
        self.times.append(now)

    def summary(self, t_start: float, warmup_frac: float = 0.1, min_warmup: int = 2) -> dict:
        """Steady-state rate: batches after the warm-up ones (the first
        ``max(min_warmup, ceil(warmup_frac * batches))``), from the arrival of the
        last warm-up batch to the arrival of the last batch."""
        n = len(self.times)
        w = max(min_warmup, -(-int(warmup_frac * n * 1000) // 1000))
        out = {
            "batches": n,
            "rows": sum(self.rows),
            "token_sum": self.tok_sum,
            "token_count": self.tok_count,
            "doc_id_sum": self.doc_sum,
            "time_to_first_batch_s": (self.times[0] - t_start) if n else None,
            "wall_s": (self.times[-1] - t_start) if n else None,
            # all rows / (construction -> last batch): includes the time to first batch
            "e2e_rows_per_s": (sum(self.rows) / (self.times[-1] - t_start)) if n else None,
            "check_s": self.check_s,
            "warmup_batches": w,
            "errors": self.errors[:5],
        }
        if n > w:
            dt = self.times[-1] - self.times[w - 1]
            rows = sum(self.rows[w:])
            out["steady_rows"] = rows
            out["steady_s"] = dt
            out["rows_per_s"] = rows / dt if dt > 0 else float("inf")
            out["bytes_per_s"] = out["rows_per_s"] * ROW_BYTES
        else:
            out["rows_per_s"] = None
            out["bytes_per_s"] = None
            self.errors.append(f"only {n} batches: not enough for warm-up {w} + steady state")
        return out


def peak_rss_self_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class RSSWindow:
    """This process's RSS at :meth:`start` (after imports, before the loader is
    built) and its peak from then to :meth:`result`.

    The peak is the kernel's high-water mark (``VmHWM``), reset at ``start`` by
    writing ``5`` to ``/proc/self/clear_refs``, so a transient peak during
    imports is not counted and no short peak between samples is missed. Where
    that reset is refused, a thread samples ``VmRSS`` every 5 ms instead
    (``method`` says which)."""

    def __init__(self):
        self.base_kb: int | None = None
        self.method = "none"
        self._peak = 0
        self._stop = None

    def start(self) -> None:
        import threading

        if self._stop is not None:
            self._stop.set()
            self._stop = None
        self.base_kb = _rss_kb("VmRSS")
        self.trace_python()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM"
            return
        except OSError:
            pass
        if self.base_kb is None:
            return
        self.method = "sampled"
        self._peak = self.base_kb
        stop = self._stop = threading.Event()

        def run():
            while not stop.wait(0.005):
                self._peak = max(self._peak, _rss_kb("VmRSS") or 0)

        threading.Thread(target=run, daemon=True).start()

    @staticmethod
    def trace_python() -> None:
        """Also trace Python allocations (bytes, NumPy) with ``tracemalloc``:
        slows every allocation, so only with ``BENCH_TRACEMALLOC=1``."""
        if os.environ.get("BENCH_TRACEMALLOC") == "1":
            import tracemalloc

            tracemalloc.start()
            tracemalloc.reset_peak()

    def result(self) -> dict:
        """``rss_after_imports_mb``, ``peak_rss_mb`` (since start) and their difference."""
        if self.base_kb is None:
            return {}
        if self.method == "VmHWM":
            peak = _rss_kb("VmHWM") or 0
        else:
            self._peak = max(self._peak, _rss_kb("VmRSS") or 0)
            peak = self._peak
        out = {"rss_after_imports_mb": self.base_kb / 1024, "peak_rss_since_mb": peak / 1024,
               "rss_growth_mb": (peak - self.base_kb) / 1024, "rss_method": self.method}
        import sys

        if "pyarrow" in sys.modules:  # what Arrow's pool held at most (its allocator's view)
            import pyarrow as pa

            pool = pa.default_memory_pool()
            out["arrow_pool_max_mb"] = pool.max_memory() / (1 << 20)
            out["arrow_pool"] = pool.backend_name
        import tracemalloc

        if tracemalloc.is_tracing():
            out["python_traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / (1 << 20)
        return out


#: The case process's RSS window: started after the common imports, restarted by
#: a case right before it builds its loader (after its own imports).
RSS = RSSWindow()


def memory_bound(stats: dict) -> dict:
    """The loader's memory bound from its ``stats()``: 2 x (bytes of the read-ahead
    windows it may hold + bytes of its prefetched batches), in MB."""
    if "read_ahead_bytes_max" not in stats:  # a slicefeed before these figures
        return {}
    held = stats["read_ahead_bytes_max"] + stats["prefetch_bytes_max"]
    return {"read_ahead_mb": stats["read_ahead_bytes_max"] / (1 << 20),
            "prefetch_mb": stats["prefetch_bytes_max"] / (1 << 20),
            "bound_mb": 2 * held / (1 << 20)}


def memory_summary(rs: list[dict]) -> dict | None:
    """Medians over a case's repeats of its ``memory`` figures (MB), and whether
    the growth stayed within the bound in every repeat (loaders with a bound)."""
    import statistics

    ms = [r["memory"] for r in rs if r.get("memory", {}).get("rss_growth_mb") is not None]
    if not ms:
        return None
    out = {k: statistics.median(m[k] for m in ms)
           for k in ("rss_after_imports_mb", "peak_rss_since_mb", "rss_growth_mb", "bound_mb",
                     "read_ahead_mb", "prefetch_mb", "arrow_pool_max_mb", "python_traced_peak_mb")
           if all(m.get(k) is not None for m in ms)}
    out["rss_method"] = ms[0].get("rss_method")
    if "bound_mb" in out:
        out["met"] = all(m["rss_growth_mb"] <= m["bound_mb"] for m in ms)
    return out


def memory_lines(cases: dict) -> list[str]:
    """Table rows of the cases' memory summaries (``cases[name]["memory"]``)."""
    rows = [(n, c["memory"]) for n, c in cases.items() if c.get("memory")]
    if not rows:
        return []
    out = ["", (f"{'memory (MB, this process)':<30}{'imports':>8}{'peak':>7}{'growth':>7}"
                f"{'arrow':>7}{'py':>6}{'bound':>7}  met    bound = 2 x (read-ahead + prefetch)")]

    def f(x, w):
        return f"{'-' if x is None else format(x, ',.0f'):>{w}}"

    for n, m in rows:
        b = m.get("bound_mb")
        tail = "" if b is None else (f"{b:>7,.0f}  {m['met']!s:<6} 2 x ({m['read_ahead_mb']:,.0f}"
                                     f" + {m['prefetch_mb']:,.0f})")
        out.append(f"{n:<30}{f(m['rss_after_imports_mb'], 8)}{f(m['peak_rss_since_mb'], 7)}"
                   f"{f(m['rss_growth_mb'], 7)}{f(m.get('arrow_pool_max_mb'), 7)}"
                   f"{f(m.get('python_traced_peak_mb'), 6)}{tail}")
    out.append("(arrow: most bytes Arrow's pool held; py: Python allocations' peak, traced with "
               "BENCH_TRACEMALLOC=1)")
    return out


class TreeRSSSampler:
    """Samples the summed RSS of a process and its descendants (Ray workers too)."""

    def __init__(self, pid: int, interval: float = 0.2):
        import threading

        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        try:
            import psutil
        except ImportError:  # pragma: no cover
            return
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            total = 0
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                break
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def stop(self) -> float:
        self._stop.set()
        self._t.join(timeout=2)
        return self.peak / (1 << 20)


def run_child(script: str, cfg: dict, env: dict, timeout: float, *, prefix: str,
              python: str | None = None) -> tuple[dict, bool]:
    """Runs ``python script --child <cfg as JSON>`` in its own process group.

    Returns ``(result, finished)``: the JSON result the child wrote to
    ``cfg["out"]`` (a temporary file made here) plus ``process_wall_s`` and
    ``peak_tree_rss_mb`` (the process and everything it started, Ray workers
    too), and True; or, on a timeout or a missing result, a ``status:
    FAILED ...`` entry with the log's tail, and False."""
    import tempfile

    fd, out = tempfile.mkstemp(prefix=prefix, suffix=".json")
    os.close(fd)
    cfg = {**cfg, "out": out}
    t = time.perf_counter()
    p = subprocess.Popen([python or sys.executable, os.path.abspath(script), "--child", json.dumps(cfg)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    sampler = TreeRSSSampler(p.pid)
    try:
        log, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        log, _ = p.communicate()
        sampler.stop()
        os.unlink(out)
        return {"status": f"FAILED: timeout after {timeout} s", "log_tail": log[-2000:]}, False
    tree_mb = sampler.stop()
    try:
        os.killpg(p.pid, 9)  # Ray processes the child started (os._exit skips shutdown)
    except ProcessLookupError:
        pass
    res: dict = {"process_wall_s": time.perf_counter() - t}
    try:
        with open(out) as f:
            res.update(json.load(f))
    except (OSError, json.JSONDecodeError):
        res["status"] = f"FAILED: exit code {p.returncode}, no result"
        res["log_tail"] = log[-3000:]
        return res, False
    finally:
        os.unlink(out)
    res["peak_tree_rss_mb"] = tree_mb
    return res, True


def local_ray(cpus: int):
    """Starts a local Ray of ``cpus`` CPUs for a one-process benchmark (the
    environment of :func:`process_env`, no dashboard or progress bars) and
    returns the ``ray`` module."""
    for k, v in process_env().items():
        os.environ.setdefault(k, v)
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


def timing_report(times: dict[str, list[float]], baseline: str, *, config: dict,
                  json_path: str | None, **extra: Any) -> dict:
    """Medians of ``times`` (seconds per case), each case's speedup against
    ``baseline``, printed one line per case and written to ``json_path`` with
    ``config``, the machine and ``extra``; returns that document."""
    import statistics

    med = {c: statistics.median(v) for c, v in times.items()}
    speedup = {c: med[baseline] / med[c] for c in med}
    results = {"config": config, "machine": machine_info(), **extra, "seconds": times,
               "median_seconds": med, f"speedup_vs_{baseline}": speedup}
    width = max(map(len, times)) + 2
    for c, runs in times.items():
        print(f"{c:{width}s} median {med[c]:7.3f} s  runs {', '.join(f'{x:.3f}' for x in runs)}  "
              f"x{speedup[c]:.2f} vs {baseline}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return results


def machine_info() -> dict:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["ram_gb"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    vers = {}
    for mod in ("jax", "jaxlib", "ray", "pyarrow", "numpy", "grain"):
        try:
            out = subprocess.run(
                [sys.executable, "-c", f"import importlib.metadata as m; print(m.version({mod!r}))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            vers[mod] = out.stdout.strip() or None
        except Exception:  # noqa: BLE001
            vers[mod] = None
    info["versions"] = vers
    return info


def validate(res: dict, meta: dict, expected_rows: int, epochs: int = 1) -> list[str]:
    """Problems with a case's delivered content (empty list: valid); ``expected_rows``
    per epoch, ``epochs`` passes over the dataset."""
    problems = list(res.get("errors") or [])
    if res.get("rows") != expected_rows * epochs:
        problems.append(f"delivered {res.get('rows')} rows, expected {expected_rows * epochs}")
    if expected_rows == meta["rows"]:
        tok, count = meta["token_sum"] * epochs, meta["token_count"] * epochs
        if res.get("token_sum") != tok or res.get("token_count") != count:
            problems.append(
                f"token checksum {res.get('token_sum')}/{res.get('token_count')} != expected "
                f"{tok}/{count}"
            )
        if res.get("doc_id_sum") != meta["doc_id_sum"] * epochs:
            problems.append(f"doc_id sum {res.get('doc_id_sum')} != {meta['doc_id_sum'] * epochs}")
    return problems
