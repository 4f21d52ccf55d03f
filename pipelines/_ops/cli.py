"""The ``slicefeed`` command line (argparse).

Exit codes: 0 success; 2 invalid usage or spec (bad YAML, unknown key,
refused overwrite); 1 runtime failure. Errors print one paragraph, not a
traceback, unless ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from slicefeed.connectors import AlreadyCommittedError, SpecError
from slicefeed.connectors._formats import FORMATS

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit code 2 with one paragraph
        raise _UsageError(f"{self.prog}: {message}. See `{self.prog} --help`.")


def version_text() -> str:
    """``slicefeed X (ray Y, jax Z, pyarrow W, python V)`` without importing ray or jax."""
    import platform
    from importlib import metadata

    def v(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{p} {v(p)}" for p in ("ray", "jax", "pyarrow"))
    return f"slicefeed {v('slicefeed')} ({deps}, python {platform.python_version()})"


def _init_ray(address: str | None, *, verbose: bool = False) -> None:
    """Joins ``--address``/``RAY_ADDRESS`` if given, else starts a local Ray.

    Unless ``verbose``, Ray's own INFO lines, its token-authentication notice
    and Ray Data's progress bars are not shown (the run prints its own
    progress in rows); ``-v`` shows them.
    """
    import ray

    from slicefeed.connectors._compat import quiet_ray_logging

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet_ray_logging(verbose)
    level = "INFO" if verbose else "WARNING"
    if address:
        ray.init(address=address, logging_level=level)
    else:
        # "local" never joins a stale cluster left in /tmp/ray.
        ray.init(address="local", include_dashboard=False, logging_level=level)
    if not verbose:
        from slicefeed.connectors._compat import disable_ray_data_progress_bars

        disable_ray_data_progress_bars()


def _say(args: argparse.Namespace, *lines: str) -> None:
    """Prints progress/info lines unless ``-q``."""
    if not getattr(args, "quiet", False):
        for line in lines:
            print(line, flush=True)


# -- commands ---------------------------------------------------------------------


def _cmd_validate(args: argparse.Namespace) -> int:
    from slicefeed.pipelines._pipeline import load_pipeline

    p = load_pipeline(args.pipeline, args.set, date=args.date)
    schema = p.check()
    print(f"{args.pipeline}: valid pipeline {p.name!r} ({len(p.transforms)} transforms, "
          f"fingerprint {p.fingerprint[:12]}).")
    from slicefeed.transforms import type_label

    print("output schema:")
    for f in schema:
        print(f"  {f.name}: {type_label(f)}")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    from slicefeed.pipelines._pipeline import load_pipeline

    p = load_pipeline(args.pipeline, args.set, date=args.date)
    # "Nothing to do" and "refused" are decided from storage, before Ray starts
    # (no cluster, no TPU slice is brought up for a no-op).
    report = p.decide(overwrite=args.overwrite)
    if report is None:
        p.check()
        _init_ray(args.address, verbose=args.verbose)
        report = p.run(overwrite=args.overwrite, progress=not args.quiet and not args.verbose,
                       progress_interval=args.progress_interval)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.summary())
    return EXIT_OK


def _cmd_inspect(args: argparse.Namespace) -> int:
    from slicefeed.pipelines._ops.inspect import inspect_uri

    info = inspect_uri(args.uri, fmt=args.format, options={"delimiter": args.delimiter},
                       verify=args.verify)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return EXIT_OK
    print(f"{info['uri']}: {info['kind']}")
    print(f"  rows: {info['num_rows'] if info['num_rows'] is not None else 'unknown'}")
    print(f"  files: {len(info['files'])}, bytes: {info['num_bytes']:,}")
    if info.get("fingerprint"):
        print(f"  fingerprint: {info['fingerprint']}")
    if info.get("version") is not None:
        print(f"  version: {info['version']} (retained: {', '.join(map(str, info['versions']))})")
        what = "SHA-256, sizes and row counts" if args.verify else "sizes and row counts"
        print(f"  verified: {len(info['files'])} shards ({what} match the manifest)")
    print("  schema:")
    for name, typ in info["schema"].items():
        print(f"    {name}: {typ}")
    for f in info["files"][: args.max_files]:
        rows = f.get("num_rows")
        print(f"    {f['path']}  {f['num_bytes']:,} bytes" + (f"  {rows} rows" if rows is not None else ""))
    if len(info["files"]) > args.max_files:
        print(f"    ... {len(info['files']) - args.max_files} more")
    return EXIT_OK


def _cmd_vacuum(args: argparse.Namespace) -> int:
    from slicefeed.connectors import vacuum

    r = vacuum(args.uri, retain_hours=args.retain_hours)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return EXIT_OK
    removed = ", ".join(map(str, r.versions_removed)) or "none"
    print(f"{r.uri}: current version {r.current}; removed versions: {removed}; kept: "
          f"{', '.join(map(str, r.versions_kept))}; removed {len(r.files_removed)} files.")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from slicefeed.connectors import is_committed, read_manifest, resolve_filesystem
    from slicefeed.pipelines._ops.demo import demo_spec, feed_jax, write_corpus
    from slicefeed.pipelines._pipeline import Pipeline

    root = os.path.abspath(args.dir)
    raw, out = os.path.join(root, "raw"), os.path.join(root, "out")
    t0 = time.perf_counter()
    paths = write_corpus(raw, rows=args.rows)
    import yaml

    spec = demo_spec(raw, out)
    spec_path = os.path.join(root, "pipeline.yaml")
    with open(spec_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(spec, f, sort_keys=False)
    _say(args, f"demo: wrote {args.rows} JSONL documents in {len(paths)} files to {raw} "
               f"({time.perf_counter() - t0:.1f} s); pipeline spec: {spec_path}")
    p = Pipeline(spec, source_name=spec_path)
    p.check()
    progress = {"progress": not args.quiet and not args.verbose,
                "progress_interval": args.progress_interval}
    target = resolve_filesystem(out)
    try:
        # A rerun over the same corpus is decided without Ray: nothing to do.
        report = p.decide(overwrite=args.overwrite)
        if report is None:
            _init_ray(args.address, verbose=args.verbose)
            report = p.run(overwrite=args.overwrite, **progress)
    except AlreadyCommittedError:
        # The demo's own folder, committed by a previous demo from another
        # corpus (other --rows): replaced, not refused.
        if not (is_committed(target) and read_manifest(target).metadata.get("pipeline") == p.name):
            raise
        _say(args, f"demo: the corpus changed; replacing the dataset a previous demo "
                   f"committed in {out}")
        _init_ray(args.address, verbose=args.verbose)
        report = p.run(overwrite=True, **progress)
    print(report.summary(), flush=True)
    for line in feed_jax(out):
        print(line)
    _say(args, f"demo: read it back with slicefeed.connectors.read_dataset({out!r}), "
               f"`slicefeed inspect {out}`, or JaxLoader({out!r}, global_batch_size=...).")
    return EXIT_OK


# -- parser -----------------------------------------------------------------------

# The one registration convention: every subcommand's parser sets `handler`, a
# function of the parsed args returning an exit code. Subcommands that live in
# their own modules expose `add_parser(subparsers)`; they are listed here.
_COMMAND_MODULES: tuple[str, ...] = (
    "slicefeed.pipelines._ops.k8s",
    "slicefeed.pipelines._ops.slices",
)


def output_flags(p: argparse.ArgumentParser, *, default: Any) -> None:
    """``-q``/``-v``, accepted before and after the subcommand.

    Subcommand parsers pass ``default=argparse.SUPPRESS`` so that a flag given
    before the subcommand is not reset by the subparser's default.
    """
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="print only the final summary and errors")
    g.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="also show Ray's own log lines and progress bars")


def _non_negative_hours(text: str) -> float:
    import math

    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of hours >= 0, got {text[:40]!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="slicefeed",
        description="Batch preprocessing on Ray Data that feeds TPU slices.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.add_argument("--version", action="version", version=version_text())
    output_flags(parser, default=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser, *, ray_: bool = False, spec: bool = False) -> None:
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks")
        output_flags(p, default=argparse.SUPPRESS)
        if spec:
            p.add_argument("pipeline", help="pipeline spec (YAML)")
            p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                           help="override a spec value, e.g. --set sink.uri=/tmp/out (repeatable)")
            p.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                           help="the run date for {date}/{datetime} in source and sink URIs "
                                "(default: today, UTC)")
        if ray_:
            p.add_argument("--address", default=None,
                           help="Ray cluster to use (default: RAY_ADDRESS, else a local Ray)")
            p.add_argument("--progress-interval", type=float, default=None, metavar="S",
                           help="seconds between progress lines (default: 1 on a terminal, "
                                "10 in a log)")

    p = sub.add_parser("run", help="run a pipeline and commit its sink")
    common(p, ray_=True, spec=True)
    p.add_argument("--overwrite", action="store_true",
                   help="replace a sink committed by a different pipeline")
    p.add_argument("--json", action="store_true", help="print the run report as JSON")
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser("validate", help="validate a spec against its source schema (no Ray)")
    common(p, spec=True)
    p.set_defaults(handler=_cmd_validate)

    p = sub.add_parser("inspect", help="schema, rows, files and bytes of raw files or a committed dataset")
    common(p)
    p.add_argument("uri", help="a committed dataset prefix, a file, a folder or a glob")
    p.add_argument("--format", choices=["auto", *FORMATS], default="auto")
    p.add_argument("--delimiter", default=None,
                   help="CSV field delimiter (default: tab for .tsv files, else comma)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument("--max-files", type=int, default=20, help="files to list (default 20)")
    p.add_argument("--verify", action="store_true",
                   help="check every shard's SHA-256 against the manifest (reads all bytes)")
    p.set_defaults(handler=_cmd_inspect)

    p = sub.add_parser("vacuum", help="remove old versions of a committed dataset and files "
                       "no retained version lists")
    common(p)
    p.add_argument("uri", help="a committed dataset prefix")
    p.add_argument("--retain-hours", type=_non_negative_hours, default=7 * 24.0, metavar="H",
                   help="keep versions superseded less than H hours ago (default 168 = 7 days); "
                        "the current version is always kept")
    p.add_argument("--json", action="store_true", help="print what was removed as JSON")
    p.set_defaults(handler=_cmd_vacuum)

    p = sub.add_parser("demo", help="generate a small corpus locally and run the built-in pipeline")
    common(p, ray_=True)
    p.add_argument("--dir", default="slicefeed-demo", help="folder to write into (default ./slicefeed-demo)")
    p.add_argument("--rows", type=int, default=20000, help="documents to generate (default 20000)")
    p.add_argument("--overwrite", action="store_true", help="recompute even if already committed")
    p.set_defaults(handler=_cmd_demo)

    import importlib

    for module in _COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


_USAGE_ERRORS: tuple[type[BaseException], ...] = (SpecError, AlreadyCommittedError, _UsageError)


def _root_cause(e: BaseException) -> BaseException:
    """The innermost slicefeed/builtin error under Ray's wrappers."""
    seen = set()
    cur: BaseException | None = e
    best = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        best = cur
        cause = getattr(cur, "cause", None)
        cur = cause if isinstance(cause, BaseException) else (cur.__cause__ or None)
    return best


def _one_paragraph(e: BaseException) -> str:
    root = _root_cause(e)
    text = str(root).strip() or type(root).__name__
    # Ray's wrappers prefix tracebacks; keep the last non-empty line group.
    if "Traceback" in text:
        text = text.strip().splitlines()[-1]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slicefeed`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if args.quiet and args.verbose:
            raise _UsageError("slicefeed: -q and -v exclude each other.")
        return int(args.handler(args) or 0)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except BrokenPipeError:  # `slicefeed inspect ... | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces stdout until exit
        return EXIT_OK
    except KeyboardInterrupt:
        print("slicefeed: interrupted; nothing was committed by the interrupted run.", file=sys.stderr)
        return 130
    except BaseException as e:
        if debug:
            raise
        root = _root_cause(e)
        usage = isinstance(e, _USAGE_ERRORS) or isinstance(root, _USAGE_ERRORS)
        kind = "error" if usage else f"{type(root).__name__}"
        print(f"slicefeed: {kind}: {_one_paragraph(e)}", file=sys.stderr)
        if not usage:
            print("(rerun with --debug for the full traceback)", file=sys.stderr)
        return EXIT_USAGE if usage else EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
