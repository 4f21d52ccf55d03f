"""The file-format registry: everything slicefeed knows about a format, in one entry.

Per format: its name (the spec's ``source.format`` and the CLI's
``--format``), the suffixes a directory listing keeps, the reader options it
accepts, its Ray datasource and reader function, and how to parse a file's
bytes for a schema peek or ``slicefeed inspect``. The readers,
:func:`~slicefeed.connectors.peek_schema`, ``slicefeed inspect``, the pipeline
spec's JSON Schema and the CLI all read :data:`FORMATS`; adding a format is one
:class:`FileFormat` entry here plus its datasource class in ``_readers.py``.

Importing this module imports neither Ray nor pyarrow (the datasource is
named, and resolved on first use; parsers import pyarrow when called), so the
CLI can build its ``--format`` choices without them.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["FORMATS", "FileFormat", "format_of_path", "get_format"]


def read_json_text(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """JSON-lines ``data`` read by pyarrow, with the types of ``schema`` where given.

    A record longer than pyarrow's block (1 MiB; blocks are parsed in
    parallel) is refused as straddling two blocks: then the text is read again
    as one block.

    Raises:
        pa.ArrowInvalid: pyarrow cannot read the text, or a record is JSON
            ``null`` (pyarrow would read it as a row of nulls; see
            :func:`slicefeed.connectors._values.null_record`). Callers find the
            bad record by walking the text.
    """
    import pyarrow as pa
    import pyarrow.json as pajson

    from slicefeed.connectors import _values

    if _values.null_record(data):
        raise pa.ArrowInvalid("a record is JSON null")

    def read(schema: pa.Schema | None) -> pa.Table:
        parse = pajson.ParseOptions(explicit_schema=schema) if schema is not None else None
        try:
            return pajson.read_json(io.BytesIO(data), parse_options=parse)
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e):
                raise
        block = min(len(data) + 1, (1 << 31) - 1)
        return pajson.read_json(
            io.BytesIO(data), read_options=pajson.ReadOptions(block_size=block), parse_options=parse)

    table = read(schema)
    # pyarrow types a string that looks like a time as a timestamp ("2024-01-01"
    # becomes midnight, "10:00:00+05:00" a naive 05:00): a JSON string is kept
    # as the string it is; `cast` makes it a timestamp where wanted. A field
    # typed by the caller's schema keeps its type; one nested past MAX_NESTING
    # is refused by the caller anyway.
    given = set(schema.names) if schema is not None else set()
    wanted = pa.schema([
        f.with_type(_timestamps_as_strings(f.type))
        if f.name not in given and _values.nesting(f.type) <= _values.MAX_NESTING else f
        for f in table.schema])
    return table if wanted.equals(table.schema) else read(wanted)


def _timestamps_as_strings(t: pa.DataType) -> pa.DataType:
    """``t`` with every timestamp (at any level of lists and structs) a string."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_timestamps_as_strings(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_timestamps_as_strings(t.value_type)))
    return t


def _parse_jsonl(data: bytes, options: Mapping[str, Any]) -> pa.Table:
    return read_json_text(data)


def csv_text(data: bytes, delimiter: str, *, skip: bool = False) -> Callable[[list[str]], pa.Table]:
    """``names -> table`` re-reading those columns of a CSV file as strings, row
    for row as the typed read (``skip``: records with the wrong number of
    fields skipped, as :func:`read_csv_bytes` with ``on_invalid`` reads them)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    def as_text(names: list[str]) -> pa.Table:
        return pacsv.read_csv(
            io.BytesIO(data),
            parse_options=pacsv.ParseOptions(
                delimiter=delimiter, invalid_row_handler=(lambda _: "skip") if skip else None),
            read_options=pacsv.ReadOptions(use_threads=not skip),
            convert_options=pacsv.ConvertOptions(
                include_columns=names, column_types={n: pa.string() for n in names}))

    return as_text


#: The CSV spellings of a missing value: pyarrow's defaults less its NaN
#: spellings (``NaN``, ``nan``, ``-nan``, ``1.#QNAN``, ...). A NaN is a value,
#: kept apart from a missing one in Arrow and Parquet, so a written ``NaN``
#: arrives as NaN (as ``inf`` arrives as inf); a spelling pyarrow does not
#: parse as a float (``1.#QNAN``) keeps its column as the strings written.
CSV_NULLS = ("", "#N/A", "#N/A N/A", "#NA", "N/A", "NA", "NULL", "n/a", "null")


def read_csv_bytes(data: bytes, delimiter: str, *, on_invalid: Callable[[Any], str] | None = None,
                   columns: list[str] | None = None) -> pa.Table:
    """CSV ``data`` (a header row, then records) read by pyarrow, the one place
    CSV text is parsed. pyarrow types a column from its values; a numeric
    column holding a number not written as it prints (``02139``,
    ``+15551234567``) is kept as the strings written
    (:func:`~slicefeed.connectors._values.numbers_as_written`; ``columns``: the
    columns to look at, default all). Missing values are the :data:`CSV_NULLS`
    spellings; a written NaN is NaN. ``on_invalid``: pyarrow's
    ``invalid_row_handler`` for records with the wrong number of fields (the
    read is then single-threaded, so its line numbers are known).

    Raises:
        pyarrow.ArrowInvalid: text pyarrow cannot read as CSV.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from slicefeed.connectors import _values

    table = pacsv.read_csv(
        io.BytesIO(data),
        parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=on_invalid),
        read_options=pacsv.ReadOptions(use_threads=on_invalid is None),
        convert_options=pacsv.ConvertOptions(null_values=CSV_NULLS))
    try:
        table.schema.names  # noqa: B018 - decodes the header's names
    except UnicodeDecodeError:
        raise pa.ArrowInvalid("the header row is not valid UTF-8") from None
    return _values.numbers_as_written(table, data, delimiter,
                                      csv_text(data, delimiter, skip=on_invalid is not None),
                                      names=columns)


def _parse_csv(data: bytes, options: Mapping[str, Any]) -> pa.Table:
    return read_csv_bytes(data, options["delimiter"])


def _parse_text(data: bytes, options: Mapping[str, Any]) -> pa.Table:
    import pyarrow as pa

    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines = lines[:-1]
    return pa.table({"text": pa.array([ln.decode("utf-8", "replace") for ln in lines], pa.string())})


@dataclasses.dataclass(frozen=True)
class FileFormat:
    """One file format.

    Attributes:
        name: ``parquet``, ``jsonl``, ``csv``, ``text``.
        suffixes: File names that mark a file as this format (``x.tsv`` is CSV).
        lists_every_file: A directory listing keeps every file, not only
            ``suffixes`` (text reads any file).
        options: Reader options the format accepts besides ``columns`` and
            ``shuffle_seed`` (``delimiter`` for CSV), with their defaults.
        datasource: Name of its ``FileBasedDatasource`` class in ``_readers``.
        reader: Name of its public reader function (``read_csv``).
        takes_columns: Whether the reader accepts a ``columns`` projection.
        parse: Bytes -> table, for text formats (None: Parquet reads footers).
        suffix_options: Option defaults that depend on the file name
            (``.tsv`` files are tab-separated).
        fingerprinted_defaults: The options a pipeline fingerprint writes out
            at their defaults (those the format had when fingerprints first
            normalised specs). An option added since is left out of it while
            at its default, as transform arguments are, so adding one changes
            no existing fingerprint: do not add to this tuple.
    """

    name: str
    suffixes: tuple[str, ...]
    options: Mapping[str, Any]
    datasource: str
    reader: str
    takes_columns: bool = True
    parse: Callable[[bytes, Mapping[str, Any]], pa.Table] | None = None
    suffix_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    lists_every_file: bool = False
    fingerprinted_defaults: tuple[str, ...] = ()

    @property
    def listing_suffixes(self) -> tuple[str, ...]:
        """Suffixes a directory listing filters on (empty: keep every file)."""
        return () if self.lists_every_file else self.suffixes

    @property
    def spec_options(self) -> tuple[str, ...]:
        """Keys a pipeline spec's ``source.options`` may hold for this format."""
        base = ("columns", "shuffle_seed") if self.takes_columns else ("shuffle_seed",)
        return (*base, *self.options)

    def claims(self, path: str) -> bool:
        """Whether ``path``'s name marks it as this format."""
        return any(path.endswith(s) for s in self.suffixes)

    def options_for(self, path: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The reader options for one file: given ones, else by file name, else defaults."""
        out = dict(self.options)
        for suffix, opts in self.suffix_options.items():
            if path.endswith(suffix):
                out.update(opts)
                break
        out.update({k: v for k, v in (given or {}).items() if k in self.options and v is not None})
        return out


#: Every file format, by name. ``dataset`` (a committed slicefeed dataset) is
#: not a file format: it is read from its manifest.
FORMATS: dict[str, FileFormat] = {
    f.name: f
    for f in (
        FileFormat(
            name="parquet",
            suffixes=(".parquet", ".pq"),
            options={},
            datasource="ParquetFilesDatasource",
            reader="read_parquet",
        ),
        FileFormat(
            name="jsonl",
            suffixes=(".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz"),
            options={},
            datasource="JsonlDatasource",
            reader="read_jsonl",
            parse=_parse_jsonl,
        ),
        FileFormat(
            name="csv",
            suffixes=(".csv", ".csv.gz", ".tsv", ".tsv.gz"),
            options={"delimiter": ","},
            datasource="CsvDatasource",
            reader="read_csv",
            parse=_parse_csv,
            suffix_options={".tsv": {"delimiter": "\t"}, ".tsv.gz": {"delimiter": "\t"}},
            fingerprinted_defaults=("delimiter",),
        ),
        FileFormat(
            name="text",
            suffixes=(".txt", ".txt.gz"),
            lists_every_file=True,
            options={"drop_empty_lines": False},
            datasource="TextDatasource",
            reader="read_text",
            takes_columns=False,
            parse=_parse_text,
            fingerprinted_defaults=("drop_empty_lines",),
        ),
    )
}

def get_format(name: str) -> FileFormat:
    """The registry entry for ``name``.

    Raises:
        SpecError: listing the known formats.
    """
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        from slicefeed.connectors._errors import SpecError

        raise SpecError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}") from None


def format_of_path(path: str) -> str | None:
    """The format a file name implies (``x.tsv`` -> ``csv``), or None."""
    for f in FORMATS.values():
        if f.claims(path):
            return f.name
    return None
