"""Readers: lazy ``ray.data.Dataset`` over Parquet, JSONL, CSV and text files.

Each format is a small ``FileBasedDatasource`` subclass overriding one hook
(``_read_file``, which Ray's ``_read_stream`` calls per file), handed to ``ray.data.read_datasource`` with the filesystem
that :func:`resolve_filesystem` chose. Doing the decode in our own hook, rather
than calling ``ray.data.read_parquet``/``read_json`` directly, buys two things
Ray's readers do not give:

- errors name the file (and line, where known): Ray's ``read_parquet`` raises
  pyarrow's bare "Parquet magic bytes not found in footer" for a corrupt file;
- provenance: with ``provenance=True`` every row carries ``_sf_file`` (path
  relative to the source URI) and ``_sf_row`` (row index within that file),
  the row identity that seeded transforms, quarantine and run reports use.

File listing, glob expansion, seeded file-order shuffling
(``FileShuffleConfig``), read-task splitting, retries of transient I/O errors
(``DataContext.retried_io_errors``) and scheduling stay Ray Data's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.data.datasource import FileBasedDatasource
from ray.data.datasource.file_based_datasource import FileShuffleConfig

from slicefeed.connectors import _values
from slicefeed.connectors._errors import (
    BadRecordError,
    CorruptFileError,
    MissingColumnError,
    SpecError,
    printable,
)
from slicefeed.connectors._formats import (
    FORMATS,
    FileFormat,
    csv_text,
    get_format,
    read_csv_bytes,
    read_json_text,
)
from slicefeed.connectors._fs import (
    ResolvedPath,
    expand_paths,
    literal_base,
    resolve_filesystem,
)
from slicefeed.connectors._names import ERROR_COLUMN, PROVENANCE_FILE, PROVENANCE_ROW, RAW_COLUMN
from slicefeed.connectors._parquet import (
    int96_columns,
    int96_lost,
    open_parquet,
    open_parquet_ns,
)
from slicefeed.connectors._watch import watching

#: Column names slicefeed adds to rows; input that has them is refused (it
#: could forge a row's identity or mark rows bad). ``columns:`` in the source
#: options leaves such a column out.
RESERVED_INPUT_COLUMNS = (PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN, RAW_COLUMN)


def _check_input_names(names: Sequence[str], uri: str) -> None:
    """Refuses slicefeed's own column names, and a name given to two columns (a
    CSV header naming one twice): Parquet would keep both, and readers then
    fail on, or silently drop, one of them."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SpecError(
                f"{uri}: column {printable(name, 60)!r} appears twice (a header that names "
                "it twice?); give every column its own name in the input.")
        seen.add(name)
    clash = [n for n in names if n in RESERVED_INPUT_COLUMNS]
    if clash:
        others = [n for n in names if n not in RESERVED_INPUT_COLUMNS]
        raise SpecError(
            f"{uri}: column {clash[0]!r} is reserved by slicefeed "
            f"({', '.join(RESERVED_INPUT_COLUMNS)} carry row identity and bad-record markers). "
            "Rename it in the input, or keep the other columns with `columns: "
            f"[{', '.join(printable(n, 40) for n in others[:8])}{', ...' if len(others) > 8 else ''}]` "
            "in the source options."
        )

_FIX_HINT = (
    "Fix or remove it, or set `on_error: skip` or `on_error: quarantine` in the "
    "pipeline to count it and go on."
)


class _SlicefeedFileDatasource(FileBasedDatasource):
    """Shared plumbing: URIs in messages, column projection, provenance."""

    _FORMAT = "file"

    def __init__(
        self,
        paths: list[str],
        *,
        source: ResolvedPath,
        columns: Sequence[str] | None,
        provenance: bool,
        mark_errors: bool = False,
        watch: Any = None,
        **kwargs: Any,
    ):
        if mark_errors and not provenance:
            raise SpecError("mark_errors=True needs provenance=True: a bad record is "
                             "reported by its file and row.")
        super().__init__(paths, filesystem=source.fs, **kwargs)
        self._mark_errors = mark_errors
        self._protocol = source.protocol
        # Relative paths are stable across storages (local vs gs://), so row
        # identity, and so seeded randomness, does not depend on where data lives.
        self._base = literal_base(source.fs, source.path)
        self._columns = list(columns) if columns is not None else None
        self._provenance = provenance
        self._watch = watch

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        # A worker that dies decoding a file (a segfault, an out-of-memory kill
        # on a bomb) raises nothing; the watch lets the caller name the file.
        uri = self._uri(path)
        with watching(self._watch, f"read:{uri}", f"reading input file {uri!r}"):
            yield from self._read_file(f, path)

    def _read_file(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        raise NotImplementedError

    def get_name(self) -> str:
        return f"Read{self._FORMAT}"

    def _uri(self, path: str) -> str:
        return path if self._protocol == "file" else f"{self._protocol}://{path}"

    def _relative(self, path: str) -> str:
        if self._base and path.startswith(self._base + "/"):
            return path[len(self._base) + 1 :]
        return path.rsplit("/", 1)[-1]

    def _bad_rows(
        self,
        path: str,
        rows: Sequence[int | None],
        reasons: Sequence[str],
        raw: Sequence[bytes | None] | None = None,
    ) -> pa.Table:
        """Rows standing for records (or a whole file) that could not be decoded.

        Only provenance, the reason and the raw bytes are known; Ray Data fills
        the data columns with nulls when it concatenates blocks, and the
        pipeline removes these rows before any transform sees them.
        """
        n = len(rows)
        cols: dict[str, pa.Array] = {
            PROVENANCE_FILE: pa.array([self._relative(path)] * n, pa.string()),
            PROVENANCE_ROW: pa.array(list(rows), pa.int64()),
            ERROR_COLUMN: pa.array([f"{self._uri(path)}: {r}" for r in reasons], pa.string()),
        }
        if raw is not None:
            cols[RAW_COLUMN] = pa.array(list(raw), pa.binary())
        return pa.table(cols)

    def _kept(self, table: pa.Table) -> pa.Table:
        """The columns of ``table`` the source keeps (``columns``), for checks of
        values: a column left out is never refused for what it holds."""
        if self._columns is None:
            return table
        return table.select([c for c in table.column_names if c in self._columns])

    def _finish(
        self, table: pa.Table, path: str, first_row: int, rows: np.ndarray | None = None
    ) -> pa.Table:
        if self._columns is not None:
            missing = [c for c in self._columns if c not in table.column_names]
            if missing:
                raise MissingColumnError(
                    f"{self._uri(path)}: column(s) {missing} not found; available: "
                    f"{printable(', '.join(table.column_names), 500)}. Fix `columns` in the "
                    "source options."
                )
            table = table.select(self._columns)
        _check_input_names(table.column_names, self._uri(path))
        if self._provenance:
            n = table.num_rows
            table = table.append_column(
                PROVENANCE_FILE,
                pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(n, dtype=np.int32)), pa.array([self._relative(path)])
                ).cast(pa.string()),
            )
            if rows is None:
                rows = np.arange(first_row, first_row + n, dtype=np.int64)
            table = table.append_column(PROVENANCE_ROW, pa.array(rows, pa.int64()))
        return table


#: Rows per record batch a Parquet file is read in.
_PARQUET_BATCH = 65536


class ParquetFilesDatasource(_SlicefeedFileDatasource):
    """Parquet files, one read per file, streaming record batches."""

    _FORMAT = "Parquet"

    def _open_input_source(self, filesystem, path: str, **open_args: Any) -> pa.NativeFile:
        # Parquet needs random access to the footer.
        return filesystem.open_input_file(path)

    def _read_file(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        try:
            pf = open_parquet(f)
            int96 = int96_columns(f, pf)
        except (pa.ArrowInvalid, OSError) as e:
            if self._mark_errors:
                # Row count unknown (the footer holds it): one record with a
                # null row stands for the whole file; the pipeline lets no
                # error budget cover it.
                why = f"not a readable Parquet file ({e}); its row count is unknown"
                yield self._bad_rows(path, [None], [why])
                return
            raise CorruptFileError(
                f"{self._uri(path)} is not a readable Parquet file ({e}). Replace or "
                "remove the file and rerun."
            ) from None
        if self._columns is not None:
            missing = [c for c in self._columns if c not in pf.schema_arrow.names]
            if missing:
                raise MissingColumnError(
                    f"{self._uri(path)}: column(s) {missing} not found; available: "
                    f"{printable(', '.join(pf.schema_arrow.names), 500)}. Fix `columns` in the "
                    "source options."
                )
        row = 0
        batches = pf.iter_batches(columns=self._columns, batch_size=_PARQUET_BATCH)
        int96 = [c for c in int96 if self._columns is None or c in self._columns]
        try:
            # INT96 columns are read again at nanoseconds, batch for batch, to
            # find a value microseconds would drop (see connectors._parquet).
            at_ns = (open_parquet_ns(f, pf).iter_batches(columns=int96, batch_size=_PARQUET_BATCH)
                     if int96 else None)
            for batch in batches:
                table = pa.Table.from_batches([batch])
                if at_ns is not None:
                    self._check_int96(table, next(at_ns), int96, path, row)
                yield self._finish(table, path, row)
                row += table.num_rows
        except (pa.ArrowInvalid, OSError) as e:
            if self._mark_errors:
                # The footer knows how many rows there are: each undecoded row
                # is accounted for.
                rest = range(row, max(pf.metadata.num_rows, row + 1))
                yield self._bad_rows(
                    path, list(rest), [f"Parquet data after row {row} cannot be decoded ({e})"] * len(rest)
                )
                return
            raise CorruptFileError(
                f"{self._uri(path)}: Parquet data after row {row} cannot be decoded ({e}). "
                "Replace or remove the file and rerun."
            ) from None


    def _check_int96(self, table: pa.Table, at_ns: pa.RecordBatch, names: list[str],
                     path: str, first_row: int) -> None:
        for name in names:
            lost = int96_lost(table.column(name), at_ns.column(name))
            if lost is not None:
                where = (f"row {first_row + lost}" if pa.types.is_timestamp(at_ns.schema.field(name).type)
                         else f"a value in rows {first_row}-{first_row + table.num_rows - 1}")
                raise BadRecordError(
                    f"{self._uri(path)}: column {printable(name, 200)!r}, {where}: an INT96 "
                    "timestamp with nanoseconds. slicefeed reads INT96 at microseconds (Spark's "
                    "precision, whose range holds every date; nanoseconds end in 2262), which "
                    "would drop them. Write the column as an INT64 timestamp (pyarrow's default; "
                    "Spark: spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS) and rerun.")


class JsonlDatasource(_SlicefeedFileDatasource):
    """Newline-delimited JSON: one object per line."""

    _FORMAT = "JSONL"

    def _read_file(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        data = f.readall()
        try:
            table = read_json_text(data)
            # pyarrow's JSON reader keeps invalid UTF-8 in string values; such a
            # line is a bad record (found line by line below), never committed.
            table.validate(full=True)
        except pa.ArrowInvalid as e:
            if self._mark_errors:
                yield from self._mark_bad_lines(data, path)
                return
            raise _locate_bad_json_line(data, self._uri(path), e) from None
        kept = self._kept(table)
        if _values.too_deep(kept.schema):
            if self._mark_errors:
                yield from self._mark_bad_lines(data, path)
                return
            raise _locate_bad_json_line(data, self._uri(path), None) from None
        try:
            hits = _values.rounded_json_rows(kept, data)
        except ValueError as e:  # records not found in the text: never guess
            raise BadRecordError(
                f"{self._uri(path)}: has float64 values pyarrow may have changed (rounded "
                "integers, or numbers beyond float64's range made infinite), and they cannot "
                f"be checked ({printable(str(e), 100)}); write one JSON object per line.") from None
        if hits:
            if self._mark_errors:
                yield from self._mark_bad_lines(data, path)
                return
            row = min(hits)
            offset, why = hits[row]
            line = data.count(b"\n", 0, offset) + 1
            raise BadRecordError(
                f"{self._uri(path)}: line {line} (row {row}): {why}; "
                f"write such values as JSON strings. {_FIX_HINT}")
        yield self._finish(table, path, 0)

    def _mark_bad_lines(self, data: bytes, path: str) -> Iterator[pa.Table]:
        """Good records as rows, bad ones as marked rows (error path only: a Python loop).

        Records and their row numbers are the fast path's (see
        :func:`_json_records`). Records whose values disagree with earlier ones
        on a field's type are bad records too (see :func:`_read_json_lines`),
        and so are records with an integer float64 would round (the others
        are read again without them).
        """
        good_rows: list[int] = []
        good: list[bytes] = []
        objs: list[dict] = []
        linenos: list[int] = []
        bad_rows: list[int] = []
        reasons: list[str] = []
        raw: list[bytes] = []
        for record, (lineno, text, obj, reason) in enumerate(_json_records(data)):
            if reason is None:
                good_rows.append(record)
                good.append(text)
                objs.append(obj)
                linenos.append(lineno)
            else:
                bad_rows.append(record)
                reasons.append(f"line {lineno} {reason}")
                raw.append(text)
        while good:
            table, rows, more_bad = _read_json_lines(good, good_rows, objs, linenos)
            at = {r: i for i, r in enumerate(good_rows)}
            # One object per good record, in the table's row order.
            hits = {} if table is None else _values.rounded_json_rows(
                self._kept(table), b"\n".join(good[at[int(r)]] for r in rows))
            if not hits:
                break
            drop = {at[int(rows[k])]: why for k, (_, why) in hits.items()}
            for i, why in sorted(drop.items()):
                bad_rows.append(good_rows[i])
                reasons.append(f"line {linenos[i]}: {why}")
                raw.append(good[i])
            good, good_rows, objs, linenos = (
                [v for i, v in enumerate(x) if i not in drop]
                for x in (good, good_rows, objs, linenos))
        if good:
            if table is not None:
                yield self._finish(table, path, 0, rows=rows)
            for row, lineno, reason, line in more_bad:
                bad_rows.append(row)
                reasons.append(f"line {lineno} {reason}")
                raw.append(line)
        if bad_rows:
            yield self._bad_rows(path, bad_rows, reasons, raw)


def _read_json_lines(
    lines: list[bytes], rows: list[int], objs: list[dict], linenos: list[int]
) -> tuple[pa.Table | None, np.ndarray, list[tuple[int, int, str, bytes]]]:
    """Reads JSON-object lines whose values may disagree on a field's type.

    Each field gets the type Arrow infers for its first non-null value; lines
    that do not fit are found by bisection (``O(k log n)`` reads for ``k`` bad
    lines) and returned as ``(row, line number, reason, raw line)``.
    """
    def read(chunk: list[bytes], schema: pa.Schema | None = None) -> pa.Table:
        return read_json_text(b"\n".join(chunk), schema)

    try:
        return read(lines), np.asarray(rows, dtype=np.int64), []
    except pa.ArrowInvalid:
        pass
    # A line pyarrow cannot read even alone (a key written twice) is a bad
    # record; it must not give a field its type.
    alone: dict[int, pa.Schema | None] = {}

    def schema_of(i: int) -> pa.Schema | None:
        if i not in alone:
            try:
                alone[i] = read([lines[i]]).schema
            except pa.ArrowInvalid:
                alone[i] = None
        return alone[i]

    first: dict[str, int] = {}
    for i, obj in enumerate(objs):
        for k, v in obj.items():
            if v is not None and k not in first and schema_of(i) is not None:
                first[k] = i
    for i, obj in enumerate(objs):  # fields that are null everywhere
        for k in obj:
            if k not in first and schema_of(i) is not None:
                first[k] = i
    fields = []
    for name, i in first.items():
        schema = schema_of(i)
        idx = schema.get_field_index(name) if schema is not None else -1
        fields.append(schema.field(idx) if idx >= 0 else pa.field(name, pa.null()))
    schema = pa.schema(fields)
    tables: list[tuple[int, pa.Table]] = []
    keep: list[int] = []
    bad: list[tuple[int, int, str, bytes]] = []
    stack = [(0, len(lines))]
    while stack:
        lo, hi = stack.pop()
        try:
            tables.append((lo, read(lines[lo:hi], schema)))
            continue
        except pa.ArrowInvalid as e:
            if hi - lo == 1:
                msg = str(e).splitlines()[0] if str(e) else "type mismatch"
                # pyarrow counts rows from the start of what it read: this one line.
                msg = re.sub(r" in row \d+\.?$", "", msg)
                bad.append((rows[lo], linenos[lo], ("does not match the types of earlier "
                                                    f"lines ({printable(msg, 200)})"), lines[lo]))
                continue
        mid = (lo + hi) // 2
        stack += [(mid, hi), (lo, mid)]
    tables.sort(key=lambda t: t[0])
    for lo, t in tables:
        keep.extend(range(lo, lo + t.num_rows))
    table = pa.concat_tables([t for _, t in tables]) if tables else None
    bad.sort()
    return table, np.asarray(rows, dtype=np.int64)[keep], bad


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # pyarrow refuses such an object; Python keeps the last
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


class _TooBig(ValueError):
    """A number literal pyarrow refuses or makes infinite; args: (text, why)."""


def _float(text: str) -> float:
    why = _values.float_change(text)
    if why is not None:
        raise _TooBig(text, why)
    return float(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=_values.parse_int,
                            parse_float=_float)


def _check_record(obj: object) -> str | None:
    """Why a parsed JSON value is not a record slicefeed can keep, or None."""
    if not isinstance(obj, dict):
        kind = {type(None): "null", bool: "boolean", list: "array", str: "string"}.get(
            type(obj), "number")
        return f"is JSON {kind}, expected an object"
    for key, value in obj.items():
        levels = _values.json_nesting(value)
        if levels > _values.MAX_NESTING:
            return (f"holds column {printable(key, 80)!r} nested {levels} levels deep; "
                    f"{_values.DEPTH_ADVICE}")
    return None


def _json_records(data: bytes) -> Iterator[tuple[int, bytes, dict | None, str | None]]:
    """The records of a JSON-lines file as pyarrow reads them, as
    ``(line number, raw bytes, object or None, why it is bad or None)``.

    pyarrow reads JSON values separated by JSON whitespace, so several on one
    line, one spread over lines, or lines ended by a lone CR are records as its
    rows are; a byte-order mark is skipped. Text that stops parsing is one bad
    record up to the end of its line; the walk goes on at the next line. The
    reason follows "line N" in a message. Error path only: a Python loop.
    """
    text = data.decode("utf-8", "surrogateescape")
    pos = 1 if text.startswith("\ufeff") else 0
    line, counted = 1, 0  # line number at text[counted]

    def line_at(at: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, at)
        counted = at
        return line

    while pos < len(text):
        for start, end, obj, error in _values.json_values(text, _DECODER, pos):
            if error is None:
                raw = text[start:end].encode("utf-8", "surrogateescape")
                try:
                    raw.decode("utf-8")
                    why = _check_record(obj)
                except UnicodeDecodeError:
                    why = "is not valid UTF-8"
            elif isinstance(error, (_DuplicateKey, _TooBig)):  # its end, read without the check
                try:
                    end = _values.decode(_values.PLAIN_DECODER, text, start)[1]
                except ValueError:
                    pass
                raw = text[start:end].encode("utf-8", "surrogateescape")
                why = (f"writes the key {printable(error.args[0], 60)!r} twice in one object"
                       if isinstance(error, _DuplicateKey) else
                       f"holds the number {printable(error.args[0], 40)}, {error.args[1]}")
            else:  # up to the end of the line
                end = text.find("\n", start)
                end = len(text) if end < 0 else end
                raw = text[start:end].encode("utf-8", "surrogateescape")
                why = (f"is nested too deep; {_values.DEPTH_ADVICE}"
                       if isinstance(error, RecursionError)
                       else f"is not valid JSON ({printable(str(error), 200)})")
            yield line_at(start), raw, None if why else obj, why
            pos = end
            if error is not None:
                break
        else:
            return


def _locate_bad_json_line(data: bytes, uri: str, err: Exception | None) -> BadRecordError:
    """Finds the first bad record (only on the error path, so a Python loop is
    fine): one that is bad alone, else one whose types disagree with earlier ones."""
    records = []
    for row, (line, raw, obj, why) in enumerate(_json_records(data)):
        if why is not None:
            return BadRecordError(f"{uri}: line {line} (row {row}) {why}. {_FIX_HINT}")
        records.append((raw, row, obj, line))
    if records:
        raws, rows, objs, lines = (list(x) for x in zip(*records))
        bad = _read_json_lines(raws, rows, objs, lines)[2]
        if bad:
            row, line, why, _ = bad[0]
            return BadRecordError(f"{uri}: line {line} (row {row}) {why}. {_FIX_HINT}")
    return BadRecordError(f"{uri}: cannot be read as JSON lines ({err}). {_FIX_HINT}")


def _unclosed_quote(data: bytes, table: pa.Table) -> int | None:
    """Offset of a quote opening a CSV value that is never closed, or None.
    pyarrow reads everything after such a quote, line breaks included, as one
    value; unless it fails on a short record, that value is the last column of
    the last row. A file whose last value is quoted and closed ends with a
    quote, and an unquoted value holds no line break."""
    if table.num_rows == 0 or data.rstrip(b"\r\n").endswith(b'"'):
        return None
    last = table.column(table.num_columns - 1)[-1].as_py()
    if isinstance(last, str):
        last = last.encode("utf-8", "surrogateescape")
    if not isinstance(last, bytes) or b"\n" not in last:
        return None
    return max(data.rfind(b'"', 0, len(data) - len(last) + 1), 0)


def _csv_records(data: bytes, delimiter: str) -> list[bytes]:
    """The raw bytes of every record of CSV ``data`` after the header, as written
    (line ending left out; a quoted line break kept), in the order pyarrow reads
    them (empty lines are no records). Error path only: Python's ``csv`` module
    over the bytes read as Latin-1, one character per byte, so the record's
    lines are found from the reader's line count."""
    import csv
    import io

    lines = data.splitlines(keepends=True)
    reader = csv.reader(io.StringIO(data.decode("latin-1"), newline=""), delimiter=delimiter)
    out: list[bytes] = []
    start = 0
    for i, fields in enumerate(reader):
        end = reader.line_num
        if i > 0 and fields:
            out.append(b"".join(lines[start:end]).rstrip(b"\r\n"))
        start = end
    return out


class CsvDatasource(_SlicefeedFileDatasource):
    """CSV with a header row; the delimiter is given, or follows the file name (``.tsv``)."""

    _FORMAT = "CSV"

    def __init__(self, *args: Any, delimiter: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._delimiter = delimiter

    def _read_file(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        delimiter = FORMATS["csv"].options_for(path, {"delimiter": self._delimiter})["delimiter"]
        data = f.readall()
        try:
            table = read_csv_bytes(data, delimiter, columns=self._columns)
        except pa.ArrowInvalid as e:
            if self._mark_errors:
                yield from self._mark_bad_records(data, path, delimiter)
                return
            raise BadRecordError(
                f"{self._uri(path)}: cannot be parsed as CSV ({printable(str(e), 300)}). {_FIX_HINT}"
            ) from None
        self._check_quotes(data, table, path)
        yield from self._checked(table, path, np.arange(table.num_rows, dtype=np.int64), data,
                                 csv_text(data, delimiter), delimiter)

    def _check_quotes(self, data: bytes, table: pa.Table, path: str) -> None:
        """A quote never closed took the records after it into one value: the
        file's record count is unknown, so the file fails the run."""
        opened = _unclosed_quote(data, table)
        if opened is not None:
            line = data.count(b"\n", 0, opened) + 1
            raise BadRecordError(
                f"{self._uri(path)}: line {line} opens a quoted value that is never closed, "
                "so the records after it cannot be told apart; fix the quoting (a quote "
                "inside a quoted value is written \"\").")

    def _checked(
        self, table: pa.Table, path: str, rows: np.ndarray, data: bytes, as_text: Any,
        delimiter: str,
    ) -> Iterator[pa.Table]:
        """``table`` (file rows ``rows``) with its text columns as strings and
        no value float64 changed. pyarrow's CSV reader makes a column holding invalid
        UTF-8 ``binary`` (a CSV has no binary columns), and a column holding an
        integer beyond int64, or fractions, float64: each record with invalid
        UTF-8, with an integer float64 would round, or
        with a number beyond float64's range (made infinite) is a bad record,
        and a binary column becomes ``string`` again. A bad record's raw bytes
        are the record as written (:func:`_csv_records`).
        ``data`` is the file's text (``delimiter``-separated) and ``as_text(names)`` re-reads columns as
        strings (see :func:`~slicefeed.connectors._formats.csv_text`)."""
        # A header naming a kept column twice is the file's error, before any record's.
        _check_input_names([n for n in table.column_names
                            if self._columns is None or n in self._columns], self._uri(path))
        binary = [i for i, f in enumerate(table.schema) if pa.types.is_binary(f.type)]
        bad: dict[int, tuple[str, bytes]] = {}  # error path only: a Python loop
        for i, (why, text) in _values.rounded_csv_rows(self._kept(table), data, as_text).items():
            bad[i] = ((f"row {int(rows[i])}: {why}; keep such values out of numeric "
                       "columns (a CSV column is typed from its values)"),
                      text.encode())
        if not binary and not bad:
            yield self._finish(table, path, 0, rows=rows)
            return
        for k in binary:
            name = table.schema.field(k).name
            for i, v in enumerate(table.column(k).to_pylist()):
                if v is not None and i not in bad:
                    try:
                        v.decode("utf-8")
                    except UnicodeDecodeError:
                        why = f"row {int(rows[i])}: column {printable(name, 60)!r} is not valid UTF-8"
                        bad[i] = (why, v)
        if bad and not self._mark_errors:
            first = min(bad)
            raise BadRecordError(f"{self._uri(path)}: {bad[first][0]}. {_FIX_HINT}")
        if bad:
            # The quarantine keeps each bad record as written, not only its value.
            records = _csv_records(data, delimiter)
            for i, (why, raw) in bad.items():
                r = int(rows[i])
                # Rows are numbered by line where records were skipped: a record
                # that does not hold the value is another one, so keep the value.
                if 0 <= r < len(records) and raw in records[r]:
                    bad[i] = (why, records[r])
        keep = np.ones(table.num_rows, dtype=bool)
        keep[list(bad)] = False
        good = table.filter(pa.array(keep))
        for k in binary:
            good = good.set_column(k, good.schema.field(k).name, good.column(k).cast(pa.string()))
        yield self._finish(good, path, 0, rows=rows[keep])
        if bad:
            idx = sorted(bad)
            yield self._bad_rows(path, [int(rows[i]) for i in idx], [bad[i][0] for i in idx],
                                 [bad[i][1] for i in idx])

    def _mark_bad_records(self, data: bytes, path: str, delimiter: str) -> Iterator[pa.Table]:
        """Good records as rows, bad ones as marked rows with their raw text (error path).

        pyarrow's own ``invalid_row_handler`` skips records with the wrong
        number of fields and gives their line and text (single-threaded, so
        lines are known). Rows are numbered by record, assuming one line per
        record; where quoted line breaks make that impossible, bad records get
        a null row and their line in the reason.
        """
        skipped: list[tuple[int | None, str]] = []

        def on_invalid(row: Any) -> str:
            skipped.append((row.number, row.text))
            return "skip"

        try:
            table = read_csv_bytes(data, delimiter, on_invalid=on_invalid, columns=self._columns)
        except pa.ArrowInvalid as e:  # no header, or broken quoting
            why = f"cannot be parsed as CSV ({printable(str(e), 300)}); its row count is unknown"
            yield self._bad_rows(path, [None], [why])
            return
        n_total = table.num_rows + len(skipped)
        # Line numbers are 1-based and the header is line 1.
        idx = [None if num is None else num - 2 for num, _ in skipped]
        consistent = all(i is not None and 0 <= i < n_total for i in idx) and len(set(idx)) == len(idx)
        if consistent:
            rows = np.setdiff1d(np.arange(n_total, dtype=np.int64), np.asarray(idx, dtype=np.int64))
        else:
            rows = np.arange(table.num_rows, dtype=np.int64)
        self._check_quotes(data, table, path)
        yield from self._checked(table, path, rows, data, csv_text(data, delimiter, skip=True),
                                 delimiter)
        if skipped:
            yield self._bad_rows(
                path,
                [i if consistent else None for i in idx],
                [f"line {num if num is not None else '?'} does not have the header's number of fields"
                 for num, _ in skipped],
                [t.encode() for _, t in skipped],
            )


class TextDatasource(_SlicefeedFileDatasource):
    """Plain UTF-8 text, one row per line, in a ``text`` column."""

    _FORMAT = "Text"

    def __init__(self, *args: Any, drop_empty_lines: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._drop_empty = drop_empty_lines

    def _read_file(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        import pyarrow.compute as pc

        data = f.readall()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            if self._mark_errors:
                yield from self._mark_bad_utf8(data, path)
                return
            line = data.count(b"\n", 0, e.start)
            raise BadRecordError(
                f"{self._uri(path)}: line {line + 1} (row {line}) is not valid UTF-8 "
                f"(byte offset {e.start}). {_FIX_HINT}"
            ) from None
        text = text.removesuffix("\n")
        lines = pc.split_pattern(pa.array([text]), "\n").flatten() if text else pa.array([], pa.string())
        lines = pc.utf8_rtrim(lines, characters="\r")
        # Provenance first, so _sf_row stays the line index when empty lines are dropped.
        table = self._finish(pa.table({"text": lines}), path, 0)
        if self._drop_empty:
            table = table.filter(pc.not_equal(table["text"], ""))
        yield table


    def _mark_bad_utf8(self, data: bytes, path: str) -> Iterator[pa.Table]:
        """Valid lines as rows, invalid UTF-8 lines as marked rows (error path only)."""
        import pyarrow.compute as pc

        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines = lines[:-1]
        good_rows, good, bad_rows, reasons, raw = [], [], [], [], []
        for i, line in enumerate(lines):
            try:
                good.append(line.decode("utf-8"))
                good_rows.append(i)
            except UnicodeDecodeError as e:
                bad_rows.append(i)
                reasons.append(f"line {i + 1} is not valid UTF-8 (byte {e.start} of the line)")
                raw.append(line)
        table = self._finish(
            pa.table({"text": pc.utf8_rtrim(pa.array(good, pa.string()), characters="\r")}),
            path, 0, rows=np.asarray(good_rows, dtype=np.int64),
        )
        if self._drop_empty:
            table = table.filter(pc.not_equal(table["text"], ""))
        yield table
        yield self._bad_rows(path, bad_rows, reasons, raw)


def shard_files(files: list, shard: tuple[int, int] | None, *, uri: str) -> list:
    """Files ``index::count`` of ``files`` (sorted) for ``shard=(index, count)``:
    each of ``count`` processes reads whole, disjoint files.

    Raises:
        SpecError: a bad shard, or fewer files than shards.
    """
    if shard is None:
        return files
    index, count = shard
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise SpecError(
            f"{uri}: shard must be (index, count) with 0 <= index < count, got {shard!r}."
        )
    if len(files) < count:
        raise SpecError(
            f"{uri}: {len(files)} input file(s) cannot be split over {count} hosts (each host "
            f"reads whole files); split the input into at least {count} files, or write a "
            "committed dataset (write_parquet) and load its URI."
        )
    return files[index::count]


def _read(
    fmt: str,
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None,
    shuffle_seed: int | None,
    provenance: bool,
    suffixes: tuple[str, ...],
    fs_kwargs: dict[str, Any],
    ray_kwargs: dict[str, Any],
    datasource_kwargs: dict[str, Any] | None = None,
    mark_errors: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
) -> ray.data.Dataset:
    source = resolve_filesystem(uri, **fs_kwargs)
    paths = shard_files(expand_paths(source, suffixes=suffixes), shard, uri=source.uri)
    ds_cls: type[_SlicefeedFileDatasource] = globals()[get_format(fmt).datasource]
    datasource = ds_cls(
        paths,
        source=source,
        columns=columns,
        provenance=provenance,
        mark_errors=mark_errors,
        shuffle=FileShuffleConfig(seed=shuffle_seed) if shuffle_seed is not None else None,
        watch=watch,
        **(datasource_kwargs or {}),
    )
    return ray.data.read_datasource(datasource, **ray_kwargs)


_FS_KEYS = ("credentials", "anonymous", "project", "storage_options")


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fs_kwargs = {k: kwargs.pop(k) for k in _FS_KEYS if k in kwargs}
    return fs_kwargs, kwargs


def read_parquet(
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    shuffle_seed: int | None = None,
    provenance: bool = False,
    mark_errors: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads Parquet files: a file, a directory (recursively) or a glob.

    Args:
        uri: ``gs://bucket/prefix``, ``gs://bucket/raw/*.parquet``, a local path...
        columns: Columns to keep (projection). Default: all.
        shuffle_seed: If set, file order is shuffled with this seed (Ray's
            ``FileShuffleConfig``); the same seed gives the same order.
        provenance: Add ``_sf_file`` and ``_sf_row`` columns (row identity).
        shard: ``(index, count)``: read only files ``index::count`` of the sorted
            file list (one host's deterministic share of whole files).
        watch: Told before and after each file is read (``begin(key, what)``,
            ``end(key)``; see ``connectors._watch``), so that a worker that dies
            reading a file can be reported by that file.
        mark_errors: With ``provenance``: instead of raising, a record that
            cannot be decoded (or a whole unreadable file, with a null
            ``_sf_row``) becomes a row whose ``_sf_error`` holds the reason
            (file, line) and ``_sf_raw`` its bytes where known; good rows have
            a null ``_sf_error``. The pipeline's ``on_error: skip|quarantine``
            reads this way and removes those rows before any transform.
        **kwargs: ``credentials``, ``anonymous``, ``project``, ``storage_options``
            go to :func:`resolve_filesystem`; the rest to ``ray.data.read_datasource``
            (``override_num_blocks``, ``concurrency``, ``ray_remote_args``...).

    Returns:
        A lazy ``ray.data.Dataset``.

    Raises:
        FileNotFoundError: Nothing exists at ``uri`` (the message names it).
        CorruptFileError: On execution, a file that is not Parquet (named).

    Example:
        >>> ds = read_parquet("gs://my-bucket/raw/*.parquet", columns=["text"])  # doctest: +SKIP
    """
    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    return _read(
        "parquet", uri, columns=columns, shuffle_seed=shuffle_seed, provenance=provenance,
        suffixes=FORMATS["parquet"].listing_suffixes, mark_errors=mark_errors, fs_kwargs=fs_kwargs, ray_kwargs=ray_kwargs,
        shard=shard, watch=watch,
    )


def read_jsonl(
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    shuffle_seed: int | None = None,
    provenance: bool = False,
    mark_errors: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads newline-delimited JSON (one object per line).

    Same arguments as :func:`read_parquet`. A line that is not a JSON object
    raises :class:`BadRecordError` naming the file and the line.
    """
    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    return _read(
        "jsonl", uri, columns=columns, shuffle_seed=shuffle_seed, provenance=provenance,
        suffixes=FORMATS["jsonl"].listing_suffixes,
        mark_errors=mark_errors, fs_kwargs=fs_kwargs, ray_kwargs=ray_kwargs,
        shard=shard, watch=watch,
    )


def read_csv(
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    shuffle_seed: int | None = None,
    provenance: bool = False,
    delimiter: str | None = None,
    mark_errors: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads CSV files with a header row (types inferred by pyarrow).

    Same arguments as :func:`read_parquet`, plus ``delimiter`` (default: tab for
    ``.tsv`` files, else comma).
    """
    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    return _read(
        "csv", uri, columns=columns, shuffle_seed=shuffle_seed, provenance=provenance,
        suffixes=FORMATS["csv"].listing_suffixes, mark_errors=mark_errors, fs_kwargs=fs_kwargs, ray_kwargs=ray_kwargs,
        datasource_kwargs={"delimiter": delimiter},
        shard=shard, watch=watch,
    )


def read_text(
    uri: str | os.PathLike[str],
    *,
    shuffle_seed: int | None = None,
    provenance: bool = False,
    drop_empty_lines: bool = False,
    mark_errors: bool = False,
    shard: tuple[int, int] | None = None,
    watch: Any = None,
    **kwargs: Any,
) -> ray.data.Dataset:
    """Lazily reads UTF-8 text files, one row per line, into a ``text`` column.

    A trailing newline does not make an empty last row; ``\\r\\n`` line ends
    are handled. Invalid UTF-8 raises :class:`BadRecordError` naming the file
    and line.
    """
    fs_kwargs, ray_kwargs = _split_kwargs(dict(kwargs))
    return _read(
        "text", uri, columns=None, shuffle_seed=shuffle_seed, provenance=provenance,
        suffixes=FORMATS["text"].listing_suffixes, mark_errors=mark_errors, fs_kwargs=fs_kwargs, ray_kwargs=ray_kwargs,
        datasource_kwargs={"drop_empty_lines": drop_empty_lines},
        shard=shard, watch=watch,
    )


_PEEK_BYTES = 1 << 20


def peek_schema(
    fmt: str,
    uri: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    provenance: bool = False,
    mark_errors: bool = False,
    options: Mapping[str, Any] | None = None,
    **fs_kwargs: Any,
) -> pa.Schema:
    """The schema a reader will produce, from the first file only, without Ray.

    Parquet reads one footer; JSONL and CSV parse up to the first MiB (so a
    column that first appears later is not seen); text is always ``text: string``.
    Used to check a pipeline's transforms before any Ray work starts.

    Args:
        options: The reader options (``{"delimiter": ";"}``), as the reader
            gets them; a ``.tsv`` file is tab-separated unless they say otherwise.

    With ``mark_errors`` (the pipeline's ``on_error: skip|quarantine``) bad
    records do not stop the check: JSONL lines that are not JSON objects are
    left out, and an unreadable file is passed over for the next one.

    Raises:
        FileNotFoundError: nothing at ``uri``.
        SpecError: ``fmt`` is not a registry format.
        CorruptFileError / BadRecordError: the first file cannot be parsed (named);
            with ``mark_errors``, no file can.
    """
    file_format = get_format(fmt)
    source = resolve_filesystem(uri, **fs_kwargs)
    files = expand_paths(source, suffixes=file_format.listing_suffixes)
    error: Exception | None = None
    # Under mark_errors a bad file is skipped at run time, so look further.
    for first in files[: 20 if mark_errors else 1]:
        try:
            schema = _peek_one(file_format, source, first, options=options, mark_errors=mark_errors)
            break
        except (CorruptFileError, BadRecordError) as e:
            error = e
    else:
        assert error is not None
        raise error
    shown = source.to_uri(first)
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise MissingColumnError(
                f"{shown}: column(s) {missing} not found; available: "
                f"{printable(', '.join(schema.names), 500)}. Fix `columns` in the source options."
            )
        schema = pa.schema([schema.field(c) for c in columns])
    _check_input_names(schema.names, shown)
    if provenance:
        schema = schema.append(pa.field(PROVENANCE_FILE, pa.string())).append(
            pa.field(PROVENANCE_ROW, pa.int64())
        )
    return schema


def _peek_one(
    fmt: FileFormat,
    source: ResolvedPath,
    first: str,
    *,
    options: Mapping[str, Any] | None,
    mark_errors: bool,
) -> pa.Schema:
    """The schema of one file (see :func:`peek_schema`)."""
    shown = source.to_uri(first)
    if fmt.parse is None:  # Parquet: the footer has the schema
        try:
            with source.fs.open(first, "rb") as f:
                return open_parquet(f).schema_arrow
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptFileError(
                f"{shown} is not a readable Parquet file ({e}). Replace or remove the file and rerun."
            ) from None
    if fmt.name == "text":
        return pa.schema([("text", pa.string())])
    with source.fs.open(first, "rb", compression="infer") as f:
        head = f.read(_PEEK_BYTES)
        # Whole lines only: a first line longer than the peek is read to its end
        # (the run reads the whole file anyway), not parsed cut short.
        while len(head) % _PEEK_BYTES == 0 and head and b"\n" not in head:
            more = f.read(_PEEK_BYTES)
            if not more:
                break
            head += more
    if b"\n" in head and len(head) >= _PEEK_BYTES:
        head = head[: head.rindex(b"\n") + 1]
    opts = fmt.options_for(first, options)
    error: pa.ArrowInvalid | None = None
    try:
        schema = fmt.parse(head, opts).schema
        if fmt.name != "jsonl" or not _values.too_deep(schema):
            return schema
    except pa.ArrowInvalid as e:
        error = e
    # The first lines hold a bad record.
    if fmt.name == "jsonl":
        if mark_errors:
            records = [(n, text, obj) for n, text, obj, why in _json_records(head) if why is None]
            if records:
                # Records that disagree on a type are bad records at run time.
                table, _, _ = _read_json_lines(
                    [text for _, text, _ in records], list(range(len(records))),
                    [obj for _, _, obj in records], [n for n, _, _ in records])
                if table is not None:
                    return table.schema
        raise _locate_bad_json_line(head, shown, error) from None
    if fmt.name == "csv" and mark_errors:
        # A record with the wrong field count is a bad record at run
        # time, not a reason to refuse the schema.
        try:
            return read_csv_bytes(head, opts["delimiter"], on_invalid=lambda row: "skip").schema
        except pa.ArrowInvalid:
            pass
    raise BadRecordError(
        f"{shown}: cannot be parsed as {fmt.name.upper()} ({printable(str(error), 300)}). {_FIX_HINT}"
    ) from None
