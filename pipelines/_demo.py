"""The embedded default job behind ``slicefeed demo``: no cloud account, no cluster.

Generates a small deterministic JSONL corpus in a local folder, writes the
built-in pipeline spec beside it, and runs it into a committed Parquet dataset.
"""

from __future__ import annotations

import json
import os

import numpy as np

_WORDS = (
    "slice host chip mesh shard batch token pack step epoch seed data stream arrow "
    "table column row file bucket prefix manifest commit loader device array tensor "
    "ray task actor block dataset pipeline transform filter cast select"
).split()


def write_corpus(raw_dir: str, *, rows: int, files: int = 4, seed: int = 0) -> list[str]:
    """Writes ``rows`` JSONL documents over ``files`` files; returns their paths."""
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
        with open(path, "w", encoding="utf-8") as out:
            for i in range(lo, hi):
                text = " ".join(vocab[words[offsets[i] : offsets[i + 1]]])
                out.write(json.dumps({"id": i, "text": text, "n_words": int(lengths[i])}) + "\n")
        paths.append(path)
    return paths


def demo_spec(raw_dir: str, out_dir: str) -> dict:
    """The built-in demo pipeline."""
    return {
        "name": "slicefeed-demo",
        "seed": 0,
        "source": {"format": "jsonl", "uri": raw_dir},
        "transforms": [
            {"filter": {"expr": "n_words >= 4"}},
            {"cast": {"columns": {"id": "int32", "n_words": "int32"}}},
            {"select": {"columns": ["id", "n_words", "text"]}},
        ],
        "sink": {"format": "parquet", "uri": out_dir},
    }
