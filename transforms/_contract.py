"""The transform contract: what every transform is and promises.

A transform is a small frozen dataclass that maps one ``pyarrow.Table`` batch to
another (Ray Data's ``map_batches(..., batch_format="pyarrow")``). Its contract:

- **Picklable and stateless.** Every argument is a dataclass field, so a YAML
  item ``{rename: {mapping: {a: b}}}`` maps one-to-one onto ``Rename(mapping=...)``
  and a transform ships to Ray workers as is (:mod:`._registry` builds it).
- **Checked before Ray starts.** :meth:`Transform.output_schema` validates the
  columns and types it needs and returns the schema it produces; a pipeline folds
  it over its transform list starting from the source schema.
- **Deterministic.** Randomness comes only from the pipeline seed (given with
  :meth:`Transform.with_seed`) and the row identity (the provenance columns
  ``_sf_file`` / ``_sf_row`` added by slicefeed readers), never from global state,
  time or batch boundaries; see :mod:`._hashing`.
- **Bad data never raises.** A row a transform cannot process is marked in the
  string column ``_sf_error`` (the reason; null for good rows, the column only
  present when at least one row is bad) and gets type-correct placeholders in the
  transform's output columns. The pipeline applies its ``on_error`` policy after
  each transform; see :mod:`._badrecords`.
- **Declared capabilities.** ``needs_fit``, ``is_dataset_op`` and
  ``reshapes_rows`` are class attributes of the contract; runners read them
  directly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from slicefeed.connectors import (
    RESERVED_COLUMNS,
    MissingColumnError,
    SpecError,
    printable,
    short_repr,
)
from slicefeed.transforms._arrays import is_tensor
from slicefeed.transforms._registry import (
    check_argument_types,
    default_of,
    field_types,
    json_form,
    plain,
    register,
    typed,
)

if typing.TYPE_CHECKING:  # pragma: no cover
    import ray.data

__all__ = ["DatasetTasks", "Transform"]


class DatasetTasks:
    """How a dataset-level transform hands its per-batch functions to Ray Data.

    :meth:`Transform.dataset_op` applies every function through these
    methods, so that the runner decides the task options (a pipeline bounds
    the reruns of a task whose worker process died) and may wrap the
    function (a pipeline records which input files a task holds, to name
    them if its worker dies). ``what`` names the step in such messages. This
    base applies the functions plainly.
    """

    def map_batches(self, ds: ray.data.Dataset, fn: Any, *, what: str,
                    **kwargs: Any) -> ray.data.Dataset:
        """``ds.map_batches(fn, **kwargs)`` under the runner's policy."""
        return ds.map_batches(fn, **kwargs)

    def map_groups(self, grouped: Any, fn: Any, *, what: str, **kwargs: Any) -> ray.data.Dataset:
        """``grouped.map_groups(fn, **kwargs)`` (``grouped`` from ``ds.groupby``) under
        the runner's policy."""
        return grouped.map_groups(fn, **kwargs)


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
    #: Whether the transform only reads the columns it names (``filter``,
    #: ``select``, ``deduplicate``): it may name slicefeed's own columns
    #: (``_sf_file``, ...). Others change a named column in place unless they
    #: write an ``output`` of their own, and may not name them.
    reads_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None:
            # A subclass's own checks run on arguments of their declared types.
            @functools.wraps(own)
            def post_init(self: Transform) -> None:
                check_argument_types(self)
                self._refuse_own_output()
                own(self)

            cls.__post_init__ = post_init  # type: ignore[method-assign]
        name = cls.__dict__.get("name")
        if name:
            register(name, cls)

    def __post_init__(self) -> None:
        check_argument_types(self)
        self._refuse_own_output()

    def _refuse_own_output(self) -> None:
        """Refuses an ``output`` argument naming one of slicefeed's own columns:
        writing it would replace the rows' identity or mark them bad."""
        output = getattr(self, "output", None)
        if isinstance(output, str) and output in RESERVED_COLUMNS:
            raise SpecError(
                f"{self._label()}: output {short_repr(output)} is slicefeed's own column (the row "
                "identity and bad-record markers); it cannot be written. Give `output` a column "
                "of your own."
            )

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

    def fit(self, ds: ray.data.Dataset) -> Transform:
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

    def output_stats(self, ds: ray.data.Dataset) -> dict[str, Any]:
        """JSON-serialisable statistics of this transform's output dataset.

        For transforms whose quality is measured on their output (packing
        efficiency). The pipeline may call it on the final dataset after the
        run (one extra pass); the default is ``{}``.
        """
        return {}

    def folders_read(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """``(uri, storage options)`` of each folder whose files the transform reads.

        A pipeline's rerun fingerprint covers each such folder's listing (every
        file's path, size and generation), so output made from files that
        changed since is never "already committed". Default: none.
        """
        return ()

    def with_file_digests(self, digests: Mapping[str, str]) -> Transform:
        """Returns a copy bound to the content of the files it reads, as planned.

        ``digests`` maps a file named in a transform argument (as written) to
        the SHA-256 of its bytes, as a pipeline run's fingerprint records it. A
        transform that reads such a file (``tokenize``'s ``tokenizer.json``)
        then works with exactly that content, without checking the file per
        batch, and refuses the file if it has changed since. Default: ``self``.
        """
        return self

    def with_seed(self, seed: int) -> Transform:
        """Returns a copy that draws its randomness from ``seed``.

        Deterministic transforms return ``self``. Random transforms keep a seed
        given explicitly in their own arguments (it wins over the pipeline's).
        """
        return self

    def dataset_op(self, ds: ray.data.Dataset, *, tasks: DatasetTasks | None = None
                   ) -> ray.data.Dataset:
        """Dataset-level form of the transform (``is_dataset_op`` transforms only).

        The pipeline calls ``ds = t.dataset_op(ds, tasks=...)`` instead of
        ``ds.map_batches(t, batch_format="pyarrow")`` when ``t.is_dataset_op``
        is true (e.g. :class:`Deduplicate`, which needs to see all rows).
        Every function applied to the rows goes through ``tasks`` (default:
        plain :class:`DatasetTasks`).
        """
        return (tasks or DatasetTasks()).map_batches(
            ds, self, what=f"transform {self.name}", batch_format="pyarrow", zero_copy_batch=True)

    # -- spec round trip ----------------------------------------------------

    def to_spec(self) -> dict[str, dict[str, Any]]:
        """The YAML item that builds this transform: ``{name: {arg: value}}``."""
        args = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != default_of(f):
                args[f.name] = plain(v)
        return {self.name: args}

    def fingerprint_spec(self) -> dict[str, dict[str, Any]]:
        """What the rows this transform computes depend on, for a pipeline's rerun
        fingerprint: ``{name: {arg: value}}`` with each argument that differs from
        its default, in the type its field declares (an integer given for a float
        argument is that float).

        Two transforms with equal ``fingerprint_spec()`` compute the same rows,
        so a spec that writes a default out, or writes a number as ``1`` instead
        of ``1.0``, is the same pipeline. Arguments at their defaults are left
        out, so an option added later whose default keeps the earlier output
        leaves the fingerprints of existing pipelines as they were. A transform
        whose argument can be written several ways that mean the same
        (``filter``'s expression) returns its one form. Call it on the
        transform a pipeline runs (after :meth:`with_seed`), so that a seed
        left to the pipeline and the same seed written out are one value.
        """
        hints = field_types(type(self))

        def form(v: Any, name: str) -> str:
            return json.dumps(json_form(typed(v, hints.get(name))), sort_keys=True)

        args = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            v, default = getattr(self, f.name), default_of(f)
            if default is dataclasses.MISSING or form(v, f.name) != form(default, f.name):
                args[f.name] = typed(v, hints.get(f.name))
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
        """Checks ``column`` exists (and has one of ``kinds``); returns its type.

        Raises:
            SpecError: also when the transform would change one of slicefeed's
                own columns (row identity, bad-record markers) in place.
        """
        output = getattr(self, "output", None)
        if column in RESERVED_COLUMNS and not self.reads_only and output in (None, column):
            raise SpecError(
                f"{self._label()}: column {short_repr(column)} is slicefeed's own column (the row "
                "identity and bad-record markers); it cannot be changed in place. Name "
                "another column in the " + short_repr(arg) + " argument" + (
                    ", or give `output` a column of your own" if hasattr(self, "output") else "") + "."
            )
        if column not in schema.names:
            avail = ", ".join(n for n in schema.names if n not in RESERVED_COLUMNS)
            raise MissingColumnError(
                f"{self._label()}: column {short_repr(column)} not found; available: "
                f"{printable(avail, 500) or '(none)'}"
                f". Fix the {short_repr(arg)} argument."
            )
        t = schema.field(column).type
        if kinds and not any(_is_kind(t, k) for k in kinds):
            raise SpecError(
                f"{self._label()}: column {short_repr(column)} has type {t}; expected "
                f"{' or '.join(kinds)}. Add a cast or pick another column."
            )
        return t

    def _label(self) -> str:
        return type(self).__name__

    def _spec_error(self, msg: str) -> SpecError:
        return SpecError(f"{self._label()}: {msg}")

    def _column_list(self, value: Any, arg: str) -> tuple[str, ...]:
        """``value`` as a tuple of distinct column names (the ``arg`` argument)."""
        if isinstance(value, str) or not isinstance(value, Sequence) or not value:
            raise self._spec_error(f"{arg} must be a non-empty list of column names; got {short_repr(value)}")
        if not all(isinstance(v, str) for v in value):
            raise self._spec_error(f"{arg} must contain column names (strings); got {short_repr(value)}")
        dup = sorted({v for v in value if list(value).count(v) > 1})
        if dup:
            raise self._spec_error(f"{arg} names column {short_repr(dup[0])} twice")
        return tuple(value)

    def _column_mapping(self, value: Any, arg: str) -> dict[str, Any]:
        """``value`` as a non-empty ``{column: ...}`` dict (the ``arg`` argument)."""
        if not isinstance(value, Mapping) or not value:
            raise self._spec_error(
                f"{arg} must be a non-empty mapping of column names, e.g. {{old: new}}; got {short_repr(value)}"
            )
        if not all(isinstance(k, str) for k in value):
            raise self._spec_error(f"{arg} keys must be column names (strings); got {short_repr(value)}")
        return dict(value)


_KINDS = {
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "binary": lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
    "integer": pa.types.is_integer,
    "floating": pa.types.is_floating,
    "numeric": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "boolean": pa.types.is_boolean,
    "list": lambda t: _is_list(t),
    "list<integer>": lambda t: _is_list(t) and pa.types.is_integer(t.value_type),
}


def _is_list(t: pa.DataType) -> bool:
    # A one-dimensional tensor column is the fixed-size list's successor layout.
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or (is_tensor(t) and len(t.shape) == 1)
    )


def _is_kind(t: pa.DataType, kind: str) -> bool:
    return _KINDS[kind](t)
