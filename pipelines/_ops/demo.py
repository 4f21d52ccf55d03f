"""The embedded default job behind ``slicefeed demo``: no cloud account, no cluster.

Generates a small deterministic JSONL corpus in a local folder, writes the
built-in text recipe (``pipelines/recipes/text_lm.yaml``: tokenize, pack to
2048) beside it with the folder's paths, and runs it into a committed Parquet
dataset of TPU-ready rows.
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
    """The built-in text recipe (``text_lm``), pointed at ``raw_dir`` and ``out_dir``.

    JSONL text -> byte-level tokens with EOS -> best-fit packed rows of 2048
    int32 tokens with segment ids and positions -> committed Parquet.
    """
    from slicefeed.pipelines._spec import load_spec
    from slicefeed.pipelines.recipes import recipe_path

    return load_spec(recipe_path("text_lm"), [f"source.uri={raw_dir}", f"sink.uri={out_dir}"])
