"""Arrow-native batch transforms (``pa.Table -> pa.Table``). Never imports jax.

Public API::

    from slicefeed.transforms import (
        Transform, TRANSFORMS, get_transform, transform_from_spec, check_transforms,
        apply_transforms, split_errors, mark_errors, bad_record_error,
        PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN,
        Select, Rename, Cast, Filter,
    )
"""

from slicefeed.transforms._base import (
    ERROR_COLUMN,
    ON_ERROR_POLICIES,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    RESERVED_COLUMNS,
    TRANSFORMS,
    Transform,
    apply_transforms,
    bad_record_error,
    check_transforms,
    describe_rows,
    get_transform,
    mark_errors,
    row_keys,
    row_uniform,
    split_errors,
    transform_from_spec,
)
from slicefeed.transforms._dtypes import (
    as_bfloat16,
    is_bfloat16_field,
)
from slicefeed.transforms._expr import compile_expression
from slicefeed.transforms._tabular import Cast, Filter, Rename, Select

__all__ = [
    "Cast",
    "ERROR_COLUMN",
    "Filter",
    "ON_ERROR_POLICIES",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "RESERVED_COLUMNS",
    "Rename",
    "Select",
    "TRANSFORMS",
    "Transform",
    "apply_transforms",
    "as_bfloat16",
    "bad_record_error",
    "check_transforms",
    "compile_expression",
    "describe_rows",
    "get_transform",
    "is_bfloat16_field",
    "mark_errors",
    "row_keys",
    "row_uniform",
    "split_errors",
    "transform_from_spec",
]
