"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI.

Public API::

    from slicefeed.pipelines import load_pipeline, Pipeline, RunReport, SliceSpec
"""

from slicefeed.pipelines._pipeline import Pipeline, RunReport, load_pipeline
from slicefeed.pipelines._spec import apply_overrides, fingerprint, load_spec, validate_spec
from slicefeed.pipelines._topology import SliceSpec

__all__ = [
    "Pipeline",
    "RunReport",
    "SliceSpec",
    "apply_overrides",
    "fingerprint",
    "load_pipeline",
    "load_spec",
    "validate_spec",
]
