"""interleave(): weighted, seed-deterministic mixtures of sources."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from slicefeed.connectors import SpecError, read_jsonl
from slicefeed.pipelines._mixture import interleave, mixture_report, plan_counts
from slicefeed.transforms import PROVENANCE_FILE, PROVENANCE_ROW


def _write(d: str, name: str, rows: list[int], per_file: int = 15) -> str:
    src = os.path.join(d, name)
    os.makedirs(src)
    for k in range(0, len(rows), per_file):
        with open(os.path.join(src, f"part-{k // per_file}.jsonl"), "w") as f:
            f.writelines(json.dumps({"src": name, "v": r}) + "\n" for r in rows[k : k + per_file])
    return src


@pytest.fixture
def sources(local_dir):
    return {
        "web": _write(local_dir, "web", list(range(40))),
        "code": _write(local_dir, "code", list(range(100, 125))),
        "books": _write(local_dir, "books", list(range(200, 260))),
    }


def _collect(ds) -> pa.Table:
    import ray

    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def test_plan_counts():
    assert plan_counts([40, 25, 60], [2, 1, 1]) == [40, 20, 20]
    assert plan_counts([10, 100], [1, 1]) == [10, 10]
    assert plan_counts([9, 9, 9], [1, 1, 1]) == [9, 9, 9]


def test_plan_counts_floor_is_exact():
    """floor(p_i * T) of the weights' exact values: a product just below an
    integer is not rounded up, and exact products are not floored below it."""
    assert plan_counts([10, 3], [1.0, 1.0000000001]) == [2, 3]
    assert plan_counts([3, 10], [1.0000000001, 1.0]) == [3, 2]
    assert plan_counts([7, 7, 7], [0.1, 0.2, 0.7]) == [1, 2, 7]
    assert plan_counts([10, 10], [1e-300, 1.0]) == [0, 10]


@pytest.mark.slow
def test_interleave_proportions_order_and_determinism(sources, ray_cluster):
    dss = {k: read_jsonl(v, provenance=True) for k, v in sources.items()}
    ds, counts = interleave(dss, [2, 1, 1], seed=7)
    assert counts == {"web": 40, "code": 20, "books": 20}
    t = _collect(ds)
    assert t.num_rows == 80
    src = np.array(t.column("src").to_pylist())
    # Every prefix holds each source in proportion to within one row or so.
    for n in range(1, 81):
        for name, p in (("web", 0.5), ("code", 0.25), ("books", 0.25)):
            assert abs((src[:n] == name).sum() - p * n) <= 1.0
    # Each source contributes its first rows in (file, row) order.
    v = np.array(t.column("v").to_pylist())
    assert v[src == "web"].tolist() == list(range(40))
    assert v[src == "code"].tolist() == list(range(100, 120))
    # Provenance names the source; helper columns are gone.
    assert t.column_names == ["src", "v", PROVENANCE_FILE, PROVENANCE_ROW]
    assert t.column(PROVENANCE_FILE)[0].as_py().split("/")[0] in sources
    rep = mixture_report(counts, [2, 1, 1])
    assert rep["web"] == {"rows": 40, "weight": 2.0, "proportion": 0.5, "fraction": 0.5}


def _order(tables: dict[str, pa.Table], weights, seed: int) -> list[str]:
    """The mixture order from the same keys interleave() sorts by, without Ray."""
    from slicefeed.pipelines import _mixture as m

    sizes = [t.num_rows for t in tables.values()]
    counts = plan_counts(sizes, weights)
    p = np.asarray(weights, float) / sum(weights)
    keyed = []
    for i, (name, t) in enumerate(tables.items()):
        salt = m._str_hash64(f"mixture/{seed}/{i}")
        keyed.append(m._Keyer(name, i, {"f": 0}, {}, counts[i], float(p[i]), salt)(t))
    allk = pa.concat_tables(keyed)
    order = np.lexsort((allk.column(m._SRC).to_numpy(), allk.column(m._KEY).to_numpy()))
    return [allk.column(PROVENANCE_FILE)[int(j)].as_py() + f"#{allk.column(PROVENANCE_ROW)[int(j)].as_py()}" for j in order]


def test_mixture_order_is_a_function_of_the_seed():
    def src(n):
        return pa.table({PROVENANCE_FILE: ["f"] * n, PROVENANCE_ROW: pa.array(range(n), pa.int64())})

    tables = {"a": src(50), "b": src(30), "c": src(20)}
    o7 = _order(tables, [1, 1, 1], 7)
    assert o7 == _order(tables, [1, 1, 1], 7)
    assert o7 != _order(tables, [1, 1, 1], 8)
    assert len(o7) == 60 and sorted(o7) == sorted(set(o7))
    for n in range(1, 61):
        for name in "abc":
            assert abs(sum(x.startswith(name + "/") for x in o7[:n]) - n / 3) <= 1.0


@pytest.mark.slow
def test_interleave_errors(sources, ray_cluster):
    web = read_jsonl(sources["web"], provenance=True)
    with pytest.raises(SpecError, match=r"interleave: 2 datasets but 1 weights"):
        interleave([web, web], [1])
    with pytest.raises(SpecError, match=r"interleave: weight of source '1' must be a positive number of at most 1e\+12; got 0"):
        interleave([web, web], [1, 0])
    with pytest.raises(SpecError, match=r"interleave: source '0' lacks the provenance columns"):
        interleave([read_jsonl(sources["web"]), web], [1, 1])
    narrow = web.select_columns(["v", PROVENANCE_FILE, PROVENANCE_ROW])
    with pytest.raises(SpecError, match=r"interleave: source '1' has columns v: int64.*need the same schema"):
        interleave([web, narrow], [1, 1])


@pytest.mark.slow  # a full mixture run plus a survey pass: 91 s measured under load
def test_pipeline_sources_mixture_reports_per_source_counts(sources, ray_cluster, local_dir):
    import os

    from slicefeed.connectors import read_dataset
    from slicefeed.pipelines import Pipeline

    names = list(sources)
    spec = {
        "name": "mix",
        "seed": 3,
        "sources": [
            {"name": n, "format": "jsonl", "uri": sources[n], "weight": w}
            for n, w in zip(names, [2, 1, 1])
        ],
        "sink": {"format": "parquet", "uri": os.path.join(local_dir, "mixed")},
    }
    report = Pipeline(spec).run()
    taken = {src["name"]: src["rows"] for src in report.sources}
    assert taken == {"web": 40, "code": 20, "books": 20}
    assert sum(taken.values()) == report.rows_written == report.rows_read
    # Each source's weight as written, its share, what the run read of it and
    # what it left (rows past the first source to run out).
    by = {src["name"]: src for src in report.sources}
    assert {n: (s["weight"], s["proportion"]) for n, s in by.items()} == {
        "web": (2.0, 0.5), "code": (1.0, 0.25), "books": (1.0, 0.25)}
    assert {n: (s["rows_read"], s["rows_not_taken"]) for n, s in by.items()} == {
        "web": (40, 0), "code": (20, 5), "books": (20, 40)}
    assert sum(s["rows_read"] for s in by.values()) == report.rows_read
    # Each source's first rows in (file, row) order; which rows a seed takes
    # does not change between runs (the order is checked without Ray in
    # test_interleave_proportions_order_and_determinism and below).
    rows = sorted((r["src"], r["v"]) for r in read_dataset(os.path.join(local_dir, "mixed")).iter_rows())
    assert rows == sorted([("web", v) for v in range(40)] + [("code", v) for v in range(100, 120)]
                          + [("books", v) for v in range(200, 220)])


@pytest.mark.slow
def test_mixture_source_whose_first_file_is_all_bad_records(sources, ray_cluster, local_dir):
    """A source whose first file held only bad records (its blocks have no data
    columns) failed the run under `on_error: skip` as a schema mismatch listing
    slicefeed's internal columns; its bad records are mixed in and counted."""
    from slicefeed.pipelines import Pipeline

    bad = os.path.join(local_dir, "code", "part-0.jsonl")  # sorts first in its source
    with open(bad, "w") as f:
        f.write('{"src": oops}\n' * 15)
    spec = {
        "name": "mix", "seed": 3, "on_error": "skip", "max_error_fraction": 0.5,
        "sources": [{"name": n, "format": "jsonl", "uri": sources[n], "weight": 1}
                    for n in ("web", "code")],
        "sink": {"format": "parquet", "uri": os.path.join(local_dir, "mixed")},
    }
    report = Pipeline(spec).run()
    taken = {src["name"]: src["rows"] for src in report.sources}
    # Weights apply to good rows: code holds 10 (its 15 bad records took a share
    # of 25 and the run wrote 25 web rows against 10 code rows, reporting 25/25).
    assert taken == {"web": 10, "code": 10}
    assert report.rows_skipped == 15 and report.rows_written == 20
    from slicefeed.connectors import read_dataset

    written = [r["src"] for r in read_dataset(os.path.join(local_dir, "mixed")).iter_rows()]
    assert sorted(written) == ["code"] * 10 + ["web"] * 10


@pytest.mark.slow
def test_mixture_weights_apply_to_good_rows(sources, ray_cluster, local_dir):
    """Bad records in the middle of a source are skipped where they stand; the
    rows taken from each source, and every prefix of the mixture, follow the
    weights over good rows."""
    import ray

    web = os.path.join(local_dir, "web", "part-1.jsonl")  # rows 15..29 of web
    with open(web) as f:
        lines = f.read().splitlines()
    lines[2:2] = ['{"src": oops}'] * 6  # 6 bad records after web's 17th row
    with open(web, "w") as f:
        f.write("\n".join(lines) + "\n")
    # 3 after web's last good row: the mixture takes all of web, so they count too.
    with open(os.path.join(local_dir, "web", "part-2.jsonl"), "a") as f:
        f.write('{"src": oops}\n' * 3)
    dss = {k: read_jsonl(sources[k], provenance=True, mark_errors=True) for k in ("web", "code")}
    ds, counts = interleave(dss, [2, 1], seed=5)
    assert counts == {"web": 40, "code": 20}
    t = pa.concat_tables(ray.get(ds.to_arrow_refs()), promote_options="default")
    good = t.filter(pa.compute.is_null(t.column("_sf_error")))
    assert good.num_rows == 60 and t.num_rows == 69
    src = np.array(good.column("src").to_pylist())
    for n in range(1, 61):
        assert abs((src[:n] == "web").sum() - n * 2 / 3) <= 1.0, n
    v = np.array(good.column("v").to_pylist())
    assert v[src == "web"].tolist() == list(range(40))
    assert {PROVENANCE_FILE, PROVENANCE_ROW} <= set(t.column_names)


@pytest.mark.slow
def test_mixture_with_an_unreadable_file_fails_naming_it(ray_cluster, local_dir):
    """A Parquet file that cannot be read at all (its row count unknown) made the
    mixture's survey fail with a bare TypeError; the run fails naming the file,
    whatever the error budget."""
    import pyarrow.parquet as pq

    from slicefeed.connectors import BadRecordError
    from slicefeed.pipelines import Pipeline

    for name, n in (("web", 40), ("code", 30)):
        os.makedirs(os.path.join(local_dir, name))
        pq.write_table(pa.table({"src": [name] * n, "v": list(range(n))}),
                       os.path.join(local_dir, name, "b.parquet"))
    with open(os.path.join(local_dir, "web", "a.parquet"), "wb") as f:
        f.write(b"garbage, not parquet")
    spec = {
        "name": "mix", "seed": 3, "on_error": "quarantine", "max_error_fraction": 1.0,
        "sources": [{"name": n, "format": "parquet", "uri": os.path.join(local_dir, n),
                     "weight": 1} for n in ("web", "code")],
        "sink": {"format": "parquet", "uri": os.path.join(local_dir, "mixed")},
    }
    with pytest.raises(BadRecordError, match=r"could not be read at all \('web/a\.parquet'"):
        Pipeline(spec).run()


@pytest.mark.slow
def test_mixture_reports_bad_records_read_and_rows_not_taken(sources, ray_cluster, local_dir):
    """Per source, rows_read counts the records the mixture took (bad ones
    included, where they stand) and rows_not_taken the ones past its quota, a
    bad record among them: together they are the source's records."""
    from slicefeed.pipelines import Pipeline

    with open(os.path.join(local_dir, "web", "part-0.jsonl"), "a") as f:
        f.write('{"src": oops}\n')  # web's 16th record: within the quota
    with open(os.path.join(local_dir, "books", "part-3.jsonl"), "a") as f:
        f.write('{"src": oops}\n')  # books' 61st record: past the quota
    spec = {
        "name": "mix", "seed": 1, "on_error": "quarantine", "max_error_fraction": 0.5,
        "sources": [{"name": n, "format": "jsonl", "uri": sources[n], "weight": 1}
                    for n in ("web", "books")],
        "sink": {"format": "parquet", "uri": os.path.join(local_dir, "mixed")},
    }
    report = Pipeline(spec).run()
    by = {src["name"]: src for src in report.sources}
    assert {n: (s["rows"], s["rows_read"], s["rows_not_taken"]) for n, s in by.items()} == {
        "web": (40, 41, 0), "books": (40, 40, 21)}
    assert report.rows_read == 81 and report.rows_quarantined == 1 and report.rows_written == 80


def _committed_shards(uri: str) -> list[tuple[str, int, str, list[dict]]]:
    """The committed shards in manifest (write task) order: name without the
    writer id, rows, SHA-256 and the rows themselves, read in file order."""
    import pyarrow.parquet as pq

    from slicefeed.connectors import read_manifest, resolve_filesystem

    m = read_manifest(resolve_filesystem(uri))
    return [(f.path.replace(f.writer, "<writer>"), f.num_rows, f.sha256,
             pq.read_table(os.path.join(uri, f.path)).to_pylist()) for f in m.files]


@pytest.mark.slow  # two mixture runs, one with a 6 s stall: 36 s measured on 2 CPUs
def test_mixture_then_packing_commits_the_same_shards_every_run(ray_cluster, local_dir, monkeypatch):
    """The same spec, seed and input commit the same shards: the same rows in
    the same order in each, byte for byte, however Ray's tasks finish.

    Packing depends on batch boundaries, and the blocks after the mixture's Ray
    sort (whose range boundaries are sampled) once differed from run to run (354,
    356 and 354 packed rows); the mixed rows are now split into a number of blocks
    fixed by the counts. Their order across shards was then suspected to follow
    the order in which write tasks finish; it does not (the pipeline's dataset
    keeps block order), and the order that did differ between two runs was that
    of reading the datasets back (``read_dataset(...).to_arrow_refs()`` yields
    shards as their read tasks finish). Here one of the first run's first
    write tasks stalls, so that later shards finish first, and the shards are
    compared through the manifest, in order."""
    import random

    import tests.pipelines._stall_transform  # noqa: F401 - registers test_stall
    from slicefeed.pipelines import Pipeline, _mixture

    monkeypatch.setattr(_mixture, "MIX_BLOCK_ROWS", 32, raising=False)  # several blocks
    rnd = random.Random(0)
    for src in ("web", "code"):
        os.makedirs(os.path.join(local_dir, src))
        for f in range(3):
            with open(os.path.join(local_dir, src, f"f{f}.jsonl"), "w") as out:
                for i in range(40):
                    text = " ".join(rnd.choice(["ab", "cd", "efg", "hijk"]) for _ in range(rnd.randint(1, 12)))
                    out.write(json.dumps({"id": f * 1000 + i, "text": text}) + "\n")
    # One marker for both runs (the same spec): the first batch of web's first
    # file (the first blocks) stalls in the first run only.
    marker = os.path.join(local_dir, "stalled")
    runs = []
    for run in range(2):
        spec = {
            "name": "mix-pack", "seed": 3,
            "sources": [{"name": s, "format": "jsonl", "uri": os.path.join(local_dir, s),
                         "weight": w} for s, w in (("web", 2), ("code", 1))],
            "transforms": [{"test_stall": {"marker": marker, "match": "web/f0", "seconds": 6}},
                           {"tokenize": {"column": "text", "tokenizer": "bytes", "add_eos": True}},
                           {"pack_sequences": {"column": "tokens", "seq_len": 64}}],
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, f"out{run}")},
        }
        report = Pipeline(spec).run()
        assert report.status == "committed"
        assert os.path.exists(marker)  # the first run stalled
        runs.append(_committed_shards(os.path.join(local_dir, f"out{run}")))
    assert len(runs[0]) > 3  # several shards (one per block)
    # The same rows in the same order in each shard, then the same bytes.
    assert [rows for *_, rows in runs[0]] == [rows for *_, rows in runs[1]]
    assert [meta for *meta, _ in runs[0]] == [meta for *meta, _ in runs[1]]


@pytest.mark.slow
def test_mixture_schema_check_takes_each_source_first_file(ray_cluster):
    """The survey took a source's schema from whichever block arrived first, so
    a source whose files differ in types passed the schema check on one run and
    failed it on another; it is the schema of the source's first file."""
    from slicefeed.connectors._compat import dataset_preserving_order
    from slicefeed.pipelines._mixture import _survey

    def block(f: str, v: pa.Array) -> pa.Table:
        return pa.table({"v": v, PROVENANCE_FILE: [f] * len(v),
                         PROVENANCE_ROW: pa.array(range(len(v)), pa.int64())})

    import ray

    # Blocks in this order: b.jsonl (strings) arrives before a.jsonl (integers).
    ds = dataset_preserving_order(ray.data.from_arrow(
        [block("b.jsonl", pa.array(["x", "y"])), block("a.jsonl", pa.array([1, 2, 3]))]))
    sizes, bad, schemas = _survey([ds])
    assert sizes == [{"a.jsonl": 3, "b.jsonl": 2}] and bad == [{}]
    assert schemas[0].field("v").type == pa.int64()


def test_mixture_order_of_tied_bad_records_does_not_follow_block_order(ray_cluster):
    """Bad records go with the good row after them, so consecutive ones (the end
    of one file and the start of the next) share a rank and tied in the sort;
    they came out (into quarantine files) in the order their blocks did. Every
    record now sorts by its place in its source, so both block orders mix the
    same."""
    import ray

    from slicefeed.connectors._compat import dataset_preserving_order
    from slicefeed.connectors._names import ERROR_COLUMN

    def block(f: str, v: list, bad: list[bool]) -> pa.Table:
        return pa.table({"v": pa.array(v, pa.int64()), PROVENANCE_FILE: [f] * len(v),
                         PROVENANCE_ROW: pa.array(range(len(v)), pa.int64()),
                         ERROR_COLUMN: pa.array([f"bad {f}#{i}" if b else None for i, b in enumerate(bad)],
                                                pa.string())})

    # a.jsonl rows 2-3 and b.jsonl rows 0-1 are bad: four records of one rank.
    a = block("a.jsonl", [1, 2, None, None], [False, False, True, True])
    b = block("b.jsonl", [None, None, 5, 6], [True, True, False, False])
    other = block("o.jsonl", list(range(10, 16)), [False] * 6)
    runs = []
    for blocks in ([a, b], [b, a], [b.slice(1), a, b.slice(0, 1)]):
        ds = dataset_preserving_order(ray.data.from_arrow(blocks))
        mixed, counts = interleave({"s": ds, "o": dataset_preserving_order(ray.data.from_arrow([other]))},
                                   [1, 1], seed=3)
        assert counts == {"s": 4, "o": 4}
        runs.append(_collect(mixed).to_pylist())
    assert runs[0] == runs[1] == runs[2]
    errors = [r[ERROR_COLUMN] for r in runs[0] if r[ERROR_COLUMN]]
    assert errors == ["bad a.jsonl#2", "bad a.jsonl#3", "bad b.jsonl#0", "bad b.jsonl#1"], errors


@pytest.mark.slow  # two runs, one with a 4 s stall
def test_deduplicate_then_packing_commits_the_same_shards_every_run(ray_cluster, local_dir, monkeypatch):
    """``deduplicate``'s output came in another block order on each run (Ray's
    hash shuffle hands its partitions over as its actors finish), so the shards,
    and what ``pack_sequences`` packed from each block, differed between two
    runs of one spec. Its rows now come out in key-bucket order, cut into blocks
    of a fixed row count, so both runs commit the same shards byte for byte,
    with one of the first run's read tasks stalled."""
    import random

    import tests.pipelines._stall_transform  # noqa: F401 - registers test_stall
    from slicefeed.pipelines import Pipeline
    from slicefeed.transforms import _dedup

    monkeypatch.setattr(_dedup, "DEDUP_BLOCK_ROWS", 64, raising=False)  # several blocks
    rnd = random.Random(1)
    raw = os.path.join(local_dir, "raw")
    os.makedirs(raw)
    for f in range(4):
        with open(os.path.join(raw, f"f{f}.jsonl"), "w") as out:
            for i in range(300):
                text = " ".join(rnd.choice(["ab", "cd", "efg", "hi"]) for _ in range(rnd.randint(1, 7)))
                out.write(json.dumps({"id": f * 1000 + i, "text": text}) + "\n")
    marker = os.path.join(local_dir, "stalled")
    runs = []
    for run in range(2):
        spec = {
            "name": "dedup-pack", "source": {"format": "jsonl", "uri": raw},
            "transforms": [{"test_stall": {"marker": marker, "match": "f0", "seconds": 4}},
                           {"deduplicate": {"columns": ["text"], "partitions": 8}},
                           {"tokenize": {"column": "text", "tokenizer": "bytes", "add_eos": True}},
                           {"pack_sequences": {"column": "tokens", "seq_len": 32}}],
            "sink": {"format": "parquet", "uri": os.path.join(local_dir, f"out{run}")},
        }
        assert Pipeline(spec).run().status == "committed"
        assert os.path.exists(marker)
        runs.append(_committed_shards(os.path.join(local_dir, f"out{run}")))
    assert len(runs[0]) > 2
    assert [rows for *_, rows in runs[0]] == [rows for *_, rows in runs[1]]
    assert [meta for *meta, _ in runs[0]] == [meta for *meta, _ in runs[1]]
