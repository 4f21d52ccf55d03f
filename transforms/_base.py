"""The transform contract, the registry, bad-record marking and per-row randomness.

A transform is a small frozen dataclass that maps one ``pyarrow.Table`` batch to
another (Ray Data's ``map_batches(..., batch_format="pyarrow")``). Its contract:

- **Picklable and stateless.** Every argument is a dataclass field, so a YAML
  item ``{rename: {mapping: {a: b}}}`` maps one-to-one onto ``Rename(mapping=...)``
  and a transform ships to Ray workers as is.
- **Checked before Ray starts.** :meth:`Transform.output_schema` validates the
  columns and types it needs and returns the schema it produces; a pipeline folds
  it over its transform list starting from the source schema.
- **Deterministic.** Randomness comes only from the pipeline seed (given with
  :meth:`Transform.with_seed`) and the row identity (the provenance columns
  ``_sf_file`` / ``_sf_row`` added by slicefeed readers), never from global state,
  time or batch boundaries; see :func:`row_random`.
- **Bad data never raises.** A row a transform cannot process is marked in the
  string column ``_sf_error`` (the reason; null for good rows, the column only
  present when at least one row is bad) and gets type-correct placeholders in the
  transform's output columns. The pipeline applies its ``on_error`` policy after
  each transform (:func:`split_errors`, :func:`bad_record_error`);
  :func:`apply_transforms` does the same outside Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors._errors import BadRecordError, SpecError, printable, short_repr

if typing.TYPE_CHECKING:  # pragma: no cover
    import ray.data

#: Row identity columns added by slicefeed readers (``provenance=True``).
PROVENANCE_FILE = "_sf_file"
PROVENANCE_ROW = "_sf_row"
#: Reason a row is bad (null for good rows); present only when a row is bad.
ERROR_COLUMN = "_sf_error"
#: Columns owned by slicefeed itself; transforms carry them through.
RESERVED_COLUMNS = (PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN)

ON_ERROR_POLICIES = ("fail", "skip", "quarantine")

TRANSFORMS: dict[str, type["Transform"]] = {}

_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Transform:
    """Base class of all transforms: ``pa.Table -> pa.Table``.

    Subclasses are frozen dataclasses with a class attribute ``name`` (the
    snake_case name used in YAML specs); defining ``name`` registers the class
    in :data:`TRANSFORMS`.

    Attributes:
        name: YAML name of the transform.
        needs_fit: Whether :meth:`fit` must run over the whole dataset before
            the transform can be applied.
    """

    name: ClassVar[str] = ""
    needs_fit: ClassVar[bool] = False
    #: Whether the transform is a dataset-level operation (see :meth:`dataset_op`).
    is_dataset_op: ClassVar[bool] = False
    #: Whether output rows are not input rows (PackSequences merges and splits
    #: rows): the runner must not count ``rows_in - rows_out`` as filtered.
    reshapes_rows: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name:
            if not _SNAKE.match(name):
                raise ValueError(f"transform name {name!r} must be snake_case")
            if name in TRANSFORMS and TRANSFORMS[name].__qualname__ != cls.__qualname__:
                raise ValueError(
                    f"transform name {name!r} is taken by {TRANSFORMS[name].__qualname__}"
                )
            TRANSFORMS[name] = cls

    # -- the contract -------------------------------------------------------

    def __call__(self, table: pa.Table) -> pa.Table:
        """Transforms one batch. Never raises for bad data (marks it instead)."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """Validates ``schema`` (the input) and returns the output schema.

        Raises:
            SpecError: naming the transform, the column and what was expected.
        """
        return schema

    def fit(self, ds: "ray.data.Dataset") -> "Transform":
        """Returns a fitted copy, with statistics computed over all of ``ds``.

        The default (``needs_fit = False``) returns ``self``.
        """
        return self

    @property
    def is_fitted(self) -> bool:
        """Whether the transform can be applied (always True if no fit is needed)."""
        return True

    def stats(self) -> dict[str, Any]:
        """JSON-serialisable fitted statistics (recorded in report and manifest)."""
        return {}

    def output_stats(self, ds: "ray.data.Dataset") -> dict[str, Any]:
        """JSON-serialisable statistics of this transform's output dataset.

        For transforms whose quality is measured on their output (packing
        efficiency). The pipeline may call it on the final dataset after the
        run (one extra pass); the default is ``{}``.
        """
        return {}

    def with_seed(self, seed: int) -> "Transform":
        """Returns a copy that draws its randomness from ``seed``.

        Deterministic transforms return ``self``. Random transforms keep a seed
        given explicitly in their own arguments (it wins over the pipeline's).
        """
        return self

    def dataset_op(self, ds: "ray.data.Dataset") -> "ray.data.Dataset":
        """Dataset-level form of the transform (``is_dataset_op`` transforms only).

        The pipeline calls ``ds = t.dataset_op(ds)`` instead of
        ``ds.map_batches(t, batch_format="pyarrow")`` when ``t.is_dataset_op``
        is true (e.g. :class:`Deduplicate`, which needs to see all rows).
        """
        return ds.map_batches(self, batch_format="pyarrow", zero_copy_batch=True)

    # -- spec round trip ----------------------------------------------------

    def to_spec(self) -> dict[str, dict[str, Any]]:
        """The YAML item that builds this transform: ``{name: {arg: value}}``."""
        args = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != _default_of(f):
                args[f.name] = _plain(v)
        return {self.name: args}

    # -- helpers for subclasses ---------------------------------------------

    def _require(
        self,
        schema: pa.Schema,
        column: str,
        *,
        kinds: Sequence[str] = (),
        arg: str = "column",
    ) -> pa.DataType:
        """Checks ``column`` exists (and has one of ``kinds``); returns its type."""
        if column not in schema.names:
            avail = printable(", ".join(n for n in schema.names if n not in RESERVED_COLUMNS), 500)
            raise SpecError(
                f"{self._label()}: column {short_repr(column)} not found; available: {avail or '(none)'}"
                f". Fix the {arg!r} argument."
            )
        t = schema.field(column).type
        if kinds and not any(_is_kind(t, k) for k in kinds):
            raise SpecError(
                f"{self._label()}: column {column!r} has type {t}; expected "
                f"{' or '.join(kinds)}. Add a cast or pick another column."
            )
        return t

    def _label(self) -> str:
        return type(self).__name__

    def _spec_error(self, msg: str) -> SpecError:
        return SpecError(f"{self._label()}: {msg}")


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


_KINDS = {
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "binary": lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
    "integer": pa.types.is_integer,
    "floating": pa.types.is_floating,
    "numeric": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "boolean": pa.types.is_boolean,
    "list": lambda t: pa.types.is_list(t)
    or pa.types.is_large_list(t)
    or pa.types.is_fixed_size_list(t),
    "list<integer>": lambda t: (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    )
    and pa.types.is_integer(t.value_type),
}


def _is_kind(t: pa.DataType, kind: str) -> bool:
    return _KINDS[kind](t)


# -- registry and specs -------------------------------------------------------


def _ensure_registered() -> None:
    # Importing the package registers every built-in transform.
    import slicefeed.transforms  # noqa: F401


def get_transform(name: str) -> type[Transform]:
    """The transform class registered under ``name``.

    Raises:
        SpecError: listing the allowed names when ``name`` is unknown.
    """
    _ensure_registered()
    try:
        return TRANSFORMS[name]
    except (KeyError, TypeError):
        raise SpecError(
            f"unknown transform {short_repr(name)}; allowed: {', '.join(sorted(TRANSFORMS))}"
        ) from None


def transform_from_spec(item: Mapping[str, Any] | str) -> Transform:
    """Builds a transform from a YAML spec item.

    Args:
        item: ``{"rename": {"mapping": {"a": "b"}}}``; a bare name (``"deduplicate"``)
            or ``{"name": None}`` for a transform without required arguments.

    Raises:
        SpecError: naming the transform and the unknown/missing/invalid argument
            and listing the allowed arguments.
    """
    if isinstance(item, str):
        name, args = item, {}
    elif isinstance(item, Mapping) and len(item) == 1:
        ((name, args),) = item.items()
    else:
        raise SpecError(
            f"a transform must be written as a mapping with one key, the transform "
            f"name, e.g. {{rename: {{mapping: {{a: b}}}}}}; got {short_repr(item)}"
        )
    cls = get_transform(name)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise SpecError(
            f"{name}: arguments must be a mapping of argument names to values; got "
            f"{short_repr(args)}. Allowed arguments: {_arg_list(cls)}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in args if k not in fields]
    if unknown:
        raise SpecError(
            f"{name}: unknown argument {short_repr(unknown[0])}; allowed arguments: {_arg_list(cls)}"
        )
    missing = [
        k for k, f in fields.items() if _default_of(f) is dataclasses.MISSING and k not in args
    ]
    if missing:
        raise SpecError(
            f"{name}: missing required argument {missing[0]!r}; allowed arguments: "
            f"{_arg_list(cls)}"
        )
    try:
        return cls(**dict(args))
    except SpecError:
        raise
    except (TypeError, ValueError) as e:
        raise SpecError(
            f"{name}: invalid arguments ({printable(str(e), 300)}); allowed arguments: {_arg_list(cls)}"
        ) from e


def _arg_list(cls: type[Transform]) -> str:
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        d = _default_of(f)
        out.append(f.name if d is dataclasses.MISSING else f"{f.name}={_plain(d)!r}")
    return ", ".join(out) or "(none)"


def check_transforms(schema: pa.Schema, transforms: Iterable[Transform]) -> pa.Schema:
    """Folds :meth:`Transform.output_schema` over ``transforms``; the final schema."""
    for t in transforms:
        schema = t.output_schema(schema)
    return schema


# -- bad records --------------------------------------------------------------


def mark_errors(table: pa.Table, bad: np.ndarray | pa.Array, reasons: Any) -> pa.Table:
    """Marks rows of ``table`` as bad in :data:`ERROR_COLUMN`.

    Args:
        table: The transform's output table.
        bad: Boolean mask (NumPy or Arrow) of bad rows.
        reasons: One string for all bad rows, or a sequence/array of per-row
            strings (only read where ``bad``).

    Returns:
        ``table`` unchanged when no row is bad; otherwise with ``_sf_error`` set
        for the bad rows (an earlier reason on a row is kept).
    """
    bad = np.asarray(bad, dtype=bool)
    if not bad.any():
        return table
    if isinstance(reasons, str):
        new = pc.if_else(pa.array(bad), pa.scalar(reasons, pa.string()), pa.scalar(None, pa.string()))
    else:
        r = np.asarray(reasons, dtype=object)
        new = pa.array(np.where(bad, r, None), pa.string())
    if ERROR_COLUMN in table.column_names:
        old = table.column(ERROR_COLUMN)
        merged = pc.coalesce(old, new)
        i = table.column_names.index(ERROR_COLUMN)
        return table.set_column(i, ERROR_COLUMN, merged)
    return table.append_column(pa.field(ERROR_COLUMN, pa.string()), new)


def split_errors(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Splits a transform's output into good rows and bad rows.

    Returns:
        ``(good, bad)``: ``good`` without the ``_sf_error`` column; ``bad`` keeps
        it (the reason per row). Without the column all rows are good and
        ``bad`` is empty (zero rows, same schema as ``table``).
    """
    if ERROR_COLUMN not in table.column_names:
        return table, table.slice(0, 0)
    err = table.column(ERROR_COLUMN)
    is_bad = pc.is_valid(err)
    good = table.filter(pc.invert(is_bad)).drop_columns([ERROR_COLUMN])
    bad = table.filter(is_bad)
    return good, bad


def describe_rows(bad: pa.Table, *, limit: int = 3) -> list[str]:
    """``"file.jsonl row 7: reason"`` for the first ``limit`` bad rows."""
    n = min(limit, bad.num_rows)
    head = bad.slice(0, n)
    files = (
        head.column(PROVENANCE_FILE).to_pylist()
        if PROVENANCE_FILE in head.column_names
        else [None] * n
    )
    rows = (
        head.column(PROVENANCE_ROW).to_pylist()
        if PROVENANCE_ROW in head.column_names
        else [None] * n
    )
    reasons = (
        head.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in head.column_names else [""] * n
    )
    out = []
    for f, r, why in zip(files, rows, reasons):
        where = []
        if f is not None:
            where.append(f"file {f!r}")
        if r is not None:
            where.append(f"row {r}")
        # Reasons may quote data: escaped and cut, so they cannot forge lines.
        out.append(f"{' '.join(where) or 'a row without provenance'}: {printable(why, 500)}")
    return out


def bad_record_error(bad: pa.Table, transform: Transform | str) -> BadRecordError:
    """The :class:`BadRecordError` for ``on_error: fail`` (names file and row)."""
    label = transform if isinstance(transform, str) else transform._label()
    lines = describe_rows(bad)
    more = f" ({bad.num_rows} bad rows in this batch)" if bad.num_rows > 1 else ""
    return BadRecordError(
        f"{label}: bad record at {lines[0]}{more}. Fix the input, or set on_error: skip "
        "or on_error: quarantine in the pipeline to drop such rows and count them."
        + ("".join(f"\n  {line}" for line in lines[1:]))
    )


def apply_transforms(
    table: pa.Table,
    transforms: Iterable[Transform],
    on_error: str = "fail",
) -> pa.Table:
    """Applies ``transforms`` to ``table`` in order, outside Ray.

    Args:
        table: Input batch.
        transforms: Transforms (already seeded/fitted as needed).
        on_error: ``"fail"`` raises :class:`BadRecordError` on the first bad row,
            naming ``_sf_file``/``_sf_row`` when present; ``"skip"`` and
            ``"quarantine"`` drop bad rows (use :func:`split_errors` after each
            transform yourself to keep them).

    Returns:
        The transformed table (without ``_sf_error``).
    """
    if on_error not in ON_ERROR_POLICIES:
        raise SpecError(
            f"on_error must be one of {', '.join(ON_ERROR_POLICIES)}; got {on_error!r}"
        )
    for t in transforms:
        if not t.is_fitted:
            raise SpecError(
                f"{t._label()}: needs fit() over the dataset before it can be applied"
            )
        table = t(table)
        table, bad = split_errors(table)
        if bad.num_rows and on_error == "fail":
            raise bad_record_error(bad, t)
    return table


# -- per-row randomness -------------------------------------------------------

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised over uint64 (wraps on overflow)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        x = x ^ (x >> np.uint64(31))
    return x


def _str_hash64(s: str | None) -> int:
    if s is None:
        return 0
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


def row_keys(table: pa.Table, *, seed: int, salt: str) -> np.ndarray:
    """One uint64 per row from (seed, salt, ``_sf_file``, ``_sf_row``).

    Vectorised: the file column is dictionary-encoded so only the distinct
    file names of a batch (usually one or two) are hashed in Python; the
    combination with the row index is NumPy.

    Raises:
        ValueError: if ``table`` lacks the provenance columns.
    """
    missing = [c for c in (PROVENANCE_FILE, PROVENANCE_ROW) if c not in table.column_names]
    if missing:
        raise ValueError(
            f"random transforms need the row identity columns {PROVENANCE_FILE!r} and "
            f"{PROVENANCE_ROW!r} (read with provenance=True); missing {missing}"
        )
    files = table.column(PROVENANCE_FILE)
    enc = pc.dictionary_encode(files).combine_chunks()
    file_hashes = np.array([_str_hash64(s) for s in enc.dictionary.to_pylist()], np.uint64)
    idx = enc.indices.fill_null(-1).to_numpy().astype(np.int64)
    if len(file_hashes):
        fh = np.where(idx >= 0, file_hashes[np.clip(idx, 0, None)], np.uint64(0))
    else:
        fh = np.zeros(len(idx), np.uint64)
    rows = (
        table.column(PROVENANCE_ROW)
        .cast(pa.int64())
        .fill_null(-1)
        .to_numpy()
        .astype(np.int64)
        .view(np.uint64)
    )
    base = np.uint64((_str_hash64(f"{seed}/{salt}")))
    with np.errstate(over="ignore"):
        k = _mix64(base ^ fh.astype(np.uint64))
        k = _mix64(k ^ (rows * _GOLD))
    return k


def row_uniform(keys: np.ndarray, stream: int = 0) -> np.ndarray:
    """Uniform floats in [0, 1) from ``row_keys``; ``stream`` gives independent draws."""
    with np.errstate(over="ignore"):
        x = _mix64(keys + np.uint64(stream + 1) * _GOLD)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def seeded_copy(t: Transform, seed: int) -> Transform:
    """``with_seed`` for transforms with a ``seed: int | None`` field."""
    if getattr(t, "seed", None) is not None:
        return t
    return dataclasses.replace(t, seed=int(seed))
