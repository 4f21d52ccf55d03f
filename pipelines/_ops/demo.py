"""The embedded default job behind ``slicefeed demo``: no cloud account, no cluster.

Generates a small deterministic JSONL corpus in a local folder, writes the
built-in text recipe (``pipelines/recipes/text_lm.yaml``: tokenize, pack to
2048) beside it with the folder's paths, and runs it into a committed Parquet
dataset of TPU-ready rows, then feeds that dataset to a ``JaxLoader`` on
this machine's JAX devices, as a trainer would.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

_WORDS = ["slice", "host", "chip", "mesh", "shard", "batch", "token", "pack", "step", "epoch", "seed", "data", "stream", "arrow", "table", "column", "row", "file", "bucket", "prefix", "manifest", "commit", "loader", "device", "array", "tensor", "ray", "task", "actor", "block", "dataset", "pipeline", "transform", "filter", "cast", "select"]


def write_corpus(raw_dir: str, *, rows: int, files: int = 4, seed: int = 0) -> list[str]:
    """Writes ``rows`` JSONL documents over ``files`` files; returns their paths.

    A file whose bytes are already right is not rewritten (same mtime).
    """
    os.makedirs(raw_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=rows)
    words = rng.integers(0, len(_WORDS), size=int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    vocab = np.array(_WORDS, dtype=object)
    paths = []
    per_file = -(-rows // files)
    for f in range(files):
        path = os.path.join(raw_dir, f"docs-{f:03d}.jsonl")
        lo, hi = f * per_file, min(rows, (f + 1) * per_file)
        lines = []
        for i in range(lo, hi):
            text = " ".join(vocab[words[offsets[i] : offsets[i + 1]]])
            lines.append(json.dumps({"id": i, "text": text, "n_words": int(lengths[i])}) + "\n")
        data = "".join(lines).encode("utf-8")
        # Same content -> the file is left alone (same mtime), so a second
        # demo finds its input unchanged and its dataset already committed.
        if not _same_bytes(path, data):
            with open(path, "wb") as out:
                out.write(data)
        paths.append(path)
    return paths


def _same_bytes(path: str, data: bytes) -> bool:
    try:
        if os.path.getsize(path) != len(data):
            return False
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


def feed_jax(uri: str, *, batch_rows: int = 16) -> list[str]:
    """Feeds the committed dataset at ``uri`` through a :class:`JaxLoader`, one epoch.

    Runs on this machine's JAX devices (CPU unless an accelerator is
    present; ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` simulates
    8). Returns the lines to print: devices, steps, rows/s, and the first
    batch's shapes, dtypes and sharding.
    """
    import time

    import jax

    from slicefeed.connectors import read_manifest
    from slicefeed.pipelines import JaxLoader

    n = jax.device_count()
    gbs = n * max(1, -(-batch_rows // n))
    schema = read_manifest(uri).schema
    # 64-bit integers are not fed without an explicit dtype (JAX runs with
    # x64 off); the packed demo rows are int32, this covers other columns.
    dtypes = {}
    for field in schema:
        t = field.type
        while hasattr(t, "value_type"):
            t = t.value_type
        if str(t) in ("int64", "uint64"):
            dtypes[field.name] = "int32"
    t0 = time.perf_counter()
    loader = JaxLoader(uri, global_batch_size=gbs, dtypes=dtypes or None, num_epochs=1)
    first: dict[str, Any] = {}
    steps = 0
    batch: dict[str, Any] = {}
    for batch in loader:
        if not first:
            first = dict(batch)
        steps += 1
    jax.block_until_ready(batch)
    wall = time.perf_counter() - t0
    rows = steps * gbs
    platform = jax.devices()[0].platform
    lines = [
        (f"demo: fed {uri} to a JaxLoader on {n} JAX device(s) ({platform}), "
         f"global_batch_size={gbs}: {steps} steps, {rows} rows in {wall:.2f} s "
         f"({rows / wall if wall > 0 else 0:,.0f} rows/s; a partial last batch is dropped)."),
        "demo: one batch (what a train step receives):",
    ]
    for name, arr in first.items():
        lines.append(f"  {name}: shape {tuple(arr.shape)} {arr.dtype}, {_sharding_text(arr.sharding)}")
    return lines


def _sharding_text(sharding: Any) -> str:
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return str(sharding)
    return f"{type(sharding).__name__}(mesh {dict(mesh.shape)}, spec {spec})"


def demo_spec(raw_dir: str, out_dir: str) -> dict:
    """The built-in text recipe (``text_lm``), pointed at ``raw_dir`` and ``out_dir``.

    JSONL text -> byte-level tokens with EOS -> best-fit packed rows of 2048
    int32 tokens with segment ids and positions -> committed Parquet.
    """
    from slicefeed.pipelines._spec import load_spec
    from slicefeed.pipelines.recipes import recipe_path

    return load_spec(recipe_path("text_lm"), [f"source.uri={raw_dir}", f"sink.uri={out_dir}"])
