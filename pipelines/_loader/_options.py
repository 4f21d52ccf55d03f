"""The loader's options: one frozen dataclass, validated when built."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from slicefeed.connectors import SpecError
from slicefeed.connectors._errors import short_repr
from slicefeed.pipelines._loader._convert import MASK_KEY

#: Seeds are ``0 <= seed < SEED_LIMIT`` for every source (see ``__post_init__``).
SEED_LIMIT = 2**32


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """Every ``JaxLoader`` keyword except the source, the mesh and a saved state.

    Raises:
        SpecError: from ``__post_init__``, naming the bad option and what is allowed.
    """

    global_batch_size: int
    columns: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    dtypes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pad_lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pad_values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    remainder: str = "drop"
    mask_key: str = MASK_KEY
    num_epochs: int | None = 1
    shuffle: bool = False
    seed: int = 0
    shuffle_buffer_rows: int | None = None
    prefetch: int = 2
    ray_prefetch_batches: int = 1
    sync_timeout_s: float = 600.0
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reader: str = "local"
    local_read_ahead: int = 2
    host_local: bool = False

    def __post_init__(self):
        def fix(name, value):
            object.__setattr__(self, name, value)

        def integer(name, lo, *, none_ok=False):
            v = getattr(self, name)
            if v is None and none_ok:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                kind = "an integer or None" if none_ok else "an integer"
                raise SpecError(f"JaxLoader: {name} must be >= {lo}, got {short_repr(v)} ({kind}).")

        if self.remainder not in ("drop", "pad"):
            raise SpecError(
                f"JaxLoader: remainder must be 'drop' or 'pad', got {short_repr(self.remainder)}."
            )
        if self.reader not in ("local", "ray"):
            raise SpecError(f"JaxLoader: reader must be 'local' or 'ray', got {short_repr(self.reader)}.")
        integer("num_epochs", 0, none_ok=True)
        integer("prefetch", 0)
        integer("ray_prefetch_batches", 0)
        integer("local_read_ahead", 1)
        integer("shuffle_buffer_rows", 1, none_ok=True)
        if (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                or not 0 <= self.seed < SEED_LIMIT):
            # The Ray-source shuffle seeds its buffer with (seed * 1_000_003 + epoch)
            # mod 2**32: an odd multiplier maps each seed below 2**32 to its own
            # stream; a committed dataset's plan takes any non-negative integer.
            raise SpecError(f"JaxLoader: seed must be an integer in [0, 2**32), got "
                            f"{short_repr(self.seed)}.")
        if not (isinstance(self.sync_timeout_s, (int, float)) and self.sync_timeout_s > 0):
            raise SpecError(
                "JaxLoader: sync_timeout_s must be a positive number, "
                f"got {short_repr(self.sync_timeout_s)}."
            )
        if not isinstance(self.mask_key, str) or not self.mask_key:
            raise SpecError(
                f"JaxLoader: mask_key must be a non-empty string, got {short_repr(self.mask_key)}."
            )
        if isinstance(self.columns, str) or isinstance(self.exclude, str):
            raise SpecError("JaxLoader: columns= and exclude= take a list of names, not a string.")
        fix("columns", None if self.columns is None else tuple(self.columns))
        fix("exclude", tuple(self.exclude))
        for name in ("dtypes", "pad_lengths", "pad_values", "storage_options"):
            v = getattr(self, name)
            if v is None:
                v = {}
            if not isinstance(v, Mapping):
                raise SpecError(
                    f"JaxLoader: {name} must be a mapping of column -> value, "
                    f"got {type(v).__name__}."
                )
            fix(name, dict(v))
        for name in ("shuffle", "host_local"):
            v = getattr(self, name)
            if type(v).__name__ not in ("bool", "bool_"):  # Python's or NumPy's
                raise SpecError(
                    f"JaxLoader: {name} must be True or False, got {short_repr(v)} "
                    f"({type(v).__name__}); a string such as 'false' from a config file "
                    "or command line would count as true."
                )
            fix(name, bool(v))
        fix("sync_timeout_s", float(self.sync_timeout_s))
