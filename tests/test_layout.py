"""Package layout contracts: lazy imports, one error type per failure."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slicefeed.connectors import MissingColumnError, SpecError

PACKAGES = [
    "slicefeed.connectors",
    "slicefeed.transforms",
    "slicefeed.pipelines",
    "slicefeed.pipelines.recipes",
    "slicefeed.pipelines._ops",
    "slicefeed.pipelines._ops.cli",
]

_CHECK = (
    "import sys, {module}; "
    "heavy = sorted(m for m in ('ray', 'jax') if m in sys.modules); "
    "print(','.join(heavy))"
)


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("module", PACKAGES)
def test_importing_a_package_imports_neither_ray_nor_jax(module):
    assert _fresh(_CHECK.format(module=module)) == ""


def test_cli_help_imports_neither_ray_nor_jax_nor_pyarrow():
    code = (
        "import sys, io, contextlib\n"
        "from slicefeed.pipelines._ops.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main(['--help'])\n"
        "assert rc == 0 and 'usage: slicefeed' in out.getvalue(), out.getvalue()\n"
        "for cmd in ('run', 'validate', 'inspect', 'demo', 'k8s', 'slices'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main([cmd, '--help']) == 0\n"
        "print(','.join(sorted(m for m in ('ray', 'jax', 'pyarrow') if m in sys.modules)))\n"
    )
    # pyarrow too: `--help` and argument errors answer without loading it.
    assert _fresh(code) == ""


def test_cli_help_wall_time_is_reported():
    """``slicefeed --help`` as a user runs it; the time is printed, not asserted (noisy machine)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "slicefeed.pipelines._ops.cli", "--help"],
                          capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0 and "usage: slicefeed" in proc.stdout
    print(f"slicefeed --help: {wall:.2f} s wall")


def test_lazy_names_resolve():
    import slicefeed.connectors as c
    import slicefeed.pipelines as p
    import slicefeed.transforms as t

    for mod in (c, p, t):
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{mod.__name__}.{name}"
        assert set(mod.__all__) <= set(dir(mod))
    with pytest.raises(AttributeError):
        c.no_such_name  # noqa: B018


def test_shared_names_have_one_home():
    import slicefeed.connectors as c
    import slicefeed.pipelines._spec as spec
    import slicefeed.transforms as t

    assert t.PROVENANCE_FILE is c.PROVENANCE_FILE and t.ERROR_COLUMN is c.ERROR_COLUMN
    assert t.ON_ERROR_POLICIES is c.ON_ERROR_POLICIES
    assert spec.SCHEMA["properties"]["on_error"]["enum"] == list(c.ON_ERROR_POLICIES)
    for internal in ("row_keys", "hash64", "describe_rows"):
        assert internal not in t.__all__


def test_missing_column_is_one_type(tmp_path):
    """Readers' schema peek, transforms and the loader's column checks raise MissingColumnError."""
    from slicefeed.connectors import peek_schema
    from slicefeed.transforms import Select

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(MissingColumnError, match=r"\['b'\] not found; available: a"):
        peek_schema("parquet", str(path), columns=["b"])
    with pytest.raises(MissingColumnError, match="column 'b' not found"):
        Select(columns=["b"]).output_schema(pa.schema([("a", pa.int64())]))
    err = MissingColumnError("x.parquet: column(s) ['b'] not found")
    assert isinstance(err, SpecError) and isinstance(err, KeyError) and isinstance(err, ValueError)
    assert str(err) == "x.parquet: column(s) ['b'] not found"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MissingColumnError and str(again) == str(err)


def test_read_dataset_missing_column_is_missing_column_error(ray_cluster, tmp_path):
    import ray

    from slicefeed.connectors import read_dataset, write_parquet

    uri = str(tmp_path / "ds")
    write_parquet(ray.data.from_arrow(pa.table({"a": [1, 2]})), uri)
    with pytest.raises(MissingColumnError, match=r"\['b'\] not in the dataset"):
        read_dataset(uri, columns=["b"])


def test_bad_arguments_are_spec_errors(tmp_path):
    from slicefeed.connectors import read_jsonl, resolve_filesystem

    with pytest.raises(SpecError, match="either credentials"):
        resolve_filesystem("gs://b/x", credentials="/k.json", anonymous=True)
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(SpecError, match="mark_errors=True needs provenance=True"):
        read_jsonl(str(tmp_path), mark_errors=True)
