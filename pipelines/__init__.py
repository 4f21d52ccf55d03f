"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI."""

from slicefeed.pipelines._placement import (
    apply_placement,
    placement_label_selector,
    preprocessing_placement,
)
from slicefeed.pipelines._topology import SliceSpec

__all__ = [
    "SliceSpec",
    "apply_placement",
    "placement_label_selector",
    "preprocessing_placement",
]
