"""Transforms throughput: slicefeed's Arrow/NumPy transforms vs per-row Python.

Two cases, each measured against a straightforward per-row Python
implementation of the same work, in the same run, on the same batches:

- ``tokenize_pack``: byte-level tokenize (+EOS) then first-fit pack into rows
  of ``seq_len`` (tokens / segment_ids / positions, int32).
- ``image_decode_resize``: decode PNG/JPEG bytes with Pillow (RGB) and resize
  to a fixed size (bilinear) into a dense uint8 ``(N, H, W, 3)`` array, as two
  transforms (``DecodeImage`` + ``Resize``) and fused (``DecodeImage(height,
  width)``). Pillow does the pixel work in every variant, so expect ~1x: the
  case shows what the Arrow layout costs, not a speed-up.

Self-validating: both implementations must produce identical arrays (and the
right number of rows), or the benchmark fails instead of printing a number.

    python benchmarks/transforms.py --quick --json /tmp/transforms.json

Output JSON: ``{case: {seconds, rows_per_s, bytes_per_s}, ..., "ratios": {...}}``.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time

import numpy as np
import pyarrow as pa

from slicefeed.transforms import (
    DecodeImage,
    PackSequences,
    Resize,
    Tokenize,
    read_images,
)

_WORDS = (
    "slice host chip mesh shard batch token pack step epoch seed data stream arrow "
    "table column row file bucket prefix manifest commit loader device array tensor "
    "ray task actor block dataset pipeline transform filter cast select héllo ✓"
).split()


def make_corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 400, size=n)
    words = rng.integers(0, len(_WORDS), size=int(lengths.sum()))
    vocab = np.array(_WORDS, dtype=object)
    offs = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(vocab[words[offs[i] : offs[i + 1]]]) for i in range(n)]


def make_images(n: int, size: int, seed: int = 0) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = size + int(rng.integers(0, size // 4)), size + int(rng.integers(0, size // 4))
        # Smooth content (JPEG-like statistics), not noise.
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([(x * (i % 7 + 1)) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
        a = (a + rng.integers(0, 16, a.shape)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG" if i % 2 else "PNG", quality=90)
        out.append(buf.getvalue())
    return out


# -- per-row Python baselines ---------------------------------------------------------


def baseline_tokenize_pack(texts: list[str], seq_len: int) -> dict[str, np.ndarray]:
    """Per-row Python: encode each text, first-fit pack with lists."""
    seqs = []
    for t in texts:
        ids = [b + 3 for b in t.encode("utf-8")]
        ids.append(2)
        # split long sequences into seq_len pieces
        for k in range(0, len(ids), seq_len):
            seqs.append(ids[k : k + seq_len])
    bins: list[list[list[int]]] = []
    room: list[int] = []
    for s in seqs:
        for b, r in enumerate(room):
            if r >= len(s):
                bins[b].append(s)
                room[b] -= len(s)
                break
        else:
            bins.append([s])
            room.append(seq_len - len(s))
    tokens, segs, poss = [], [], []
    for b in bins:
        row_t, row_s, row_p = [], [], []
        for j, s in enumerate(b):
            row_t += s
            row_s += [j + 1] * len(s)
            row_p += list(range(len(s)))
        pad = seq_len - len(row_t)
        tokens.append(row_t + [0] * pad)
        segs.append(row_s + [0] * pad)
        poss.append(row_p + [0] * pad)
    return {
        "tokens": np.array(tokens, np.int32),
        "segment_ids": np.array(segs, np.int32),
        "positions": np.array(poss, np.int32),
    }


def baseline_decode_resize(images: list[bytes], h: int, w: int) -> np.ndarray:
    from PIL import Image

    out = []
    for data in images:
        img = Image.open(io.BytesIO(data)).convert("RGB")
        out.append(np.asarray(img.resize((w, h), Image.BILINEAR)))
    return np.stack(out)


# -- slicefeed ------------------------------------------------------------------------------


def slicefeed_tokenize_pack(batch: pa.Table, seq_len: int) -> dict[str, np.ndarray]:
    t = Tokenize(column="text", add_eos=True)(batch)
    p = PackSequences(column="tokens", seq_len=seq_len, strategy="first_fit")(t)
    return {
        c: p.column(c).combine_chunks().flatten().to_numpy().reshape(-1, seq_len)
        for c in ("tokens", "segment_ids", "positions")
    }


def slicefeed_decode_resize(batch: pa.Table, h: int, w: int) -> np.ndarray:
    """Two transforms: DecodeImage() then Resize(h, w)."""
    out = Resize(height=h, width=w)(DecodeImage()(batch))
    images, _ = read_images(out.column("image"))
    return images


def slicefeed_decode_resize_fused(batch: pa.Table, h: int, w: int) -> np.ndarray:
    """One transform: DecodeImage(height=h, width=w)."""
    out = DecodeImage(height=h, width=w)(batch)
    images, _ = read_images(out.column("image"))
    return images


# -- harness -------------------------------------------------------------------------------


def _time(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def _batches(n: int, size: int):
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def run(quick: bool, repeat: int) -> dict:
    n_docs, seq_len, batch = (2_000, 512, 500) if quick else (20_000, 2048, 2_000)
    n_img, size, out_hw = (120, 64, 48) if quick else (1_000, 256, 224)
    results: dict = {}

    texts = make_corpus(n_docs)
    text_bytes = sum(len(t.encode()) for t in texts)
    spans = _batches(n_docs, batch)
    tables = [pa.table({"text": texts[a:b]}) for a, b in spans]

    def sf_text():
        return [slicefeed_tokenize_pack(t, seq_len) for t in tables]

    def py_text():
        return [baseline_tokenize_pack(texts[a:b], seq_len) for a, b in spans]

    s_sf, out_sf = _time(sf_text, repeat)
    s_py, out_py = _time(py_text, repeat)
    for a, b in zip(out_sf, out_py):
        for k in ("tokens", "segment_ids", "positions"):
            if not np.array_equal(a[k], b[k]):
                raise SystemExit(f"tokenize_pack: slicefeed and baseline differ in {k}")
    n_tokens = sum(int((o["segment_ids"] != 0).sum()) for o in out_sf)
    if n_tokens != text_bytes + n_docs:
        raise SystemExit(f"tokenize_pack: {n_tokens} tokens packed, expected {text_bytes + n_docs}")
    for name, s in (("tokenize_pack/slicefeed", s_sf), ("tokenize_pack/python_per_row", s_py)):
        results[name] = {"seconds": s, "rows_per_s": n_docs / s, "bytes_per_s": text_bytes / s}

    images = make_images(n_img, size)
    img_bytes = sum(len(b) for b in images)
    ispans = _batches(n_img, 64)
    itables = [pa.table({"image": pa.array(images[a:b], pa.binary())}) for a, b in ispans]

    def sf_img():
        return np.concatenate([slicefeed_decode_resize(t, out_hw, out_hw) for t in itables])

    def py_img():
        return np.concatenate([baseline_decode_resize(images[a:b], out_hw, out_hw) for a, b in ispans])

    def sf_img_fused():
        return np.concatenate([slicefeed_decode_resize_fused(t, out_hw, out_hw) for t in itables])

    s_sf, a = _time(sf_img, repeat)
    s_fu, f = _time(sf_img_fused, repeat)
    s_py, b = _time(py_img, repeat)
    if a.shape != (n_img, out_hw, out_hw, 3) or not np.array_equal(a, b) or not np.array_equal(f, b):
        raise SystemExit("image_decode_resize: slicefeed and baseline differ")
    for name, s in (
        ("image_decode_resize/slicefeed", s_sf),
        ("image_decode_resize/slicefeed_fused", s_fu),
        ("image_decode_resize/python_per_row", s_py),
    ):
        results[name] = {"seconds": s, "rows_per_s": n_img / s, "bytes_per_s": img_bytes / s}

    results["ratios"] = {
        "tokenize_pack": results["tokenize_pack/slicefeed"]["rows_per_s"]
        / results["tokenize_pack/python_per_row"]["rows_per_s"],
        "image_decode_resize": results["image_decode_resize/slicefeed"]["rows_per_s"]
        / results["image_decode_resize/python_per_row"]["rows_per_s"],
        "image_decode_resize_fused": results["image_decode_resize/slicefeed_fused"]["rows_per_s"]
        / results["image_decode_resize/python_per_row"]["rows_per_s"],
    }
    results["config"] = {
        "quick": quick,
        "repeat": repeat,
        "docs": n_docs,
        "seq_len": seq_len,
        "batch_rows": batch,
        "images": n_img,
        "image_size": size,
        "resize_to": out_hw,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
    }
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small inputs (seconds, for CI)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings per case")
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args(argv)
    results = run(args.quick, args.repeat)
    for case, r in results.items():
        if case in ("ratios", "config"):
            continue
        print(f"{case:40s} {r['rows_per_s']:>12,.0f} rows/s {r['bytes_per_s'] / 1e6:>9.2f} MB/s")
    for case, ratio in results["ratios"].items():
        print(f"{case:40s} slicefeed / per-row Python = {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
