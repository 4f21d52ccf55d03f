"""Bad records: marking rows a transform cannot process, and the on-error policy.

A transform never raises for bad data: it marks the row in ``_sf_error``
(:func:`mark_errors`). The runner splits marked rows off after each transform
(:func:`split_errors`) and applies the pipeline's ``on_error`` policy:
``fail`` raises :func:`bad_record_error` (naming file and row), ``skip`` and
``quarantine`` drop and count. :func:`apply_transforms` does the same outside Ray.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import (
    ERROR_COLUMN,
    ON_ERROR_POLICIES,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    BadRecordError,
    SpecError,
    printable,
    short_repr,
)

if typing.TYPE_CHECKING:  # pragma: no cover
    from slicefeed.transforms._contract import Transform

__all__ = ["apply_transforms", "bad_record_error", "describe_rows", "mark_errors", "split_errors"]


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
            f"on_error must be one of {', '.join(ON_ERROR_POLICIES)}; got {short_repr(on_error)}"
        )
    from slicefeed.transforms._steps import chain_steps

    transforms = list(transforms)
    for t in transforms:
        if not t.is_fitted:
            raise SpecError(
                f"{t._label()}: needs fit() over the dataset before it can be applied"
            )
    for step in chain_steps(transforms):  # fused where exact (transforms/_steps.py)
        table = step.fn(table)
        table, bad = split_errors(table)
        if bad.num_rows and on_error == "fail":
            raise bad_record_error(bad, transforms[step.first])
    return table
