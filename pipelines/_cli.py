"""The ``slicefeed`` command line."""


def main(argv=None) -> int:  # replaced by the real CLI
    raise SystemExit("slicefeed CLI: not built yet")
