"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI.

Public API::

    from slicefeed.pipelines import (
        load_pipeline, Pipeline, RunReport,   # specs and batch jobs
        JaxLoader,                            # static-shape jax.Array batches per host
        SliceSpec,                            # TPU slice topology
        preprocessing_placement,              # keep Ray Data's work off TPU hosts
    )

Importing this package does not import jax; the loader imports it when used.
"""

from slicefeed.pipelines._loader import JaxLoader
from slicefeed.pipelines._mixture import interleave, mixture_report
from slicefeed.pipelines._pipeline import Pipeline, RunReport, load_pipeline
from slicefeed.pipelines._ops.placement import (
    apply_placement,
    placement_label_selector,
    preprocessing_placement,
)
from slicefeed.pipelines._spec import apply_overrides, fingerprint, load_spec, validate_spec
from slicefeed.pipelines._ops.topology import SliceSpec
from slicefeed.pipelines.recipes import RECIPES, recipe_path

__all__ = [
    "JaxLoader",
    "RECIPES",
    "Pipeline",
    "RunReport",
    "SliceSpec",
    "apply_overrides",
    "apply_placement",
    "fingerprint",
    "interleave",
    "load_pipeline",
    "load_spec",
    "mixture_report",
    "placement_label_selector",
    "preprocessing_placement",
    "recipe_path",
    "validate_spec",
]
