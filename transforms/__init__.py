"""Arrow-native batch transforms (``pa.Table -> pa.Table``). Never imports jax.

Every transform is a frozen, picklable dataclass usable by name from a YAML
spec (``{pack_sequences: {seq_len: 2048}}``) or as a Python object, applied by
Ray Data as ``ds.map_batches(t, batch_format="pyarrow")``. See
:mod:`slicefeed.transforms._contract` for the contract (schema checks, fitting,
seeds, bad records).

Public API::

    from slicefeed.transforms import (
        Transform, TRANSFORMS, get_transform, transform_from_spec, check_transforms,
        apply_transforms, chain_steps, Step, split_errors, mark_errors, bad_record_error,
        PROVENANCE_FILE, PROVENANCE_ROW, ERROR_COLUMN,  # defined in slicefeed.connectors
        Select, Rename, Cast, Filter, FillNull, Standardize, MinMaxScale,
        HashBucket, Vocabulary, Deduplicate,
        Tokenize, PadOrTruncate, PackSequences,
        DecodeImage, DecodeResize, Resize, CenterCrop, RandomCrop, RandomFlip, NormalizeImage,
    )
"""

from slicefeed.connectors import (
    ERROR_COLUMN,
    ON_ERROR_POLICIES,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    RESERVED_COLUMNS,
)
from slicefeed.transforms._badrecords import (
    apply_transforms,
    bad_record_error,
    mark_errors,
    split_errors,
)
from slicefeed.transforms._categorical import HashBucket, Vocabulary
from slicefeed.transforms._columnops import Cast, FillNull, Filter, Rename, Select
from slicefeed.transforms._contract import DatasetTasks, Transform
from slicefeed.transforms._dedup import Deduplicate
from slicefeed.transforms._dtypes import as_bfloat16, is_bfloat16_field, type_label
from slicefeed.transforms._expr import compile_expression
from slicefeed.transforms._image import (
    CenterCrop,
    DecodeImage,
    DecodeResize,
    NormalizeImage,
    RandomCrop,
    RandomFlip,
    Resize,
    read_images,
)
from slicefeed.transforms._packing import PackSequences, packing_efficiency
from slicefeed.transforms._registry import (
    TRANSFORMS,
    check_transforms,
    get_transform,
    transform_from_spec,
)
from slicefeed.transforms._scaling import MinMaxScale, Standardize
from slicefeed.transforms._steps import Step, chain_steps
from slicefeed.transforms._text import BYTE_VOCAB_SIZE, PadOrTruncate, Tokenize, load_hf_tokenizer

__all__ = [
    "BYTE_VOCAB_SIZE",
    "ERROR_COLUMN",
    "ON_ERROR_POLICIES",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "RESERVED_COLUMNS",
    "TRANSFORMS",
    "Cast",
    "CenterCrop",
    "DatasetTasks",
    "DecodeImage",
    "DecodeResize",
    "Deduplicate",
    "FillNull",
    "Filter",
    "HashBucket",
    "MinMaxScale",
    "NormalizeImage",
    "PackSequences",
    "PadOrTruncate",
    "RandomCrop",
    "RandomFlip",
    "Rename",
    "Resize",
    "Select",
    "Standardize",
    "Step",
    "Tokenize",
    "Transform",
    "Vocabulary",
    "apply_transforms",
    "as_bfloat16",
    "bad_record_error",
    "chain_steps",
    "check_transforms",
    "compile_expression",
    "get_transform",
    "is_bfloat16_field",
    "load_hf_tokenizer",
    "mark_errors",
    "packing_efficiency",
    "read_images",
    "split_errors",
    "transform_from_spec",
    "type_label",
]
