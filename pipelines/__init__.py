"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI.

Public API::

    from slicefeed.pipelines import (
        load_pipeline, Pipeline, RunReport,   # specs and batch jobs
        JaxLoader,                            # static-shape jax.Array batches per host
        JaxLoaderSave, JaxLoaderRestore,      # its state in Orbax checkpoints (orbax extra)
        SliceSpec,                            # TPU slice topology
        preprocessing_placement,              # keep Ray Data's work off TPU hosts
    )

Importing this package imports neither Ray nor jax; each name is imported on
first use.
"""

from typing import TYPE_CHECKING, Any

from slicefeed.pipelines.recipes import RECIPES, recipe_path

# Imported on first use: building pipelines needs Ray, the loader needs jax,
# and importing the package (or running ``slicefeed --help``) needs neither.
_LAZY = {
    "JaxLoader": "_loader",
    "JaxLoaderRestore": "_loader._orbax",
    "JaxLoaderSave": "_loader._orbax",
    "interleave": "_mixture",
    "mixture_report": "_mixture",
    "Pipeline": "_pipeline",
    "RunReport": "_pipeline",
    "load_pipeline": "_pipeline",
    "apply_placement": "_ops.placement",
    "placement_label_selector": "_ops.placement",
    "preprocessing_placement": "_ops.placement",
    "apply_overrides": "_spec",
    "expand_uri_templates": "_spec",
    "fingerprint": "_spec",
    "load_spec": "_spec",
    "validate_spec": "_spec",
    "SliceSpec": "_ops.topology",
}

if TYPE_CHECKING:  # pragma: no cover
    from slicefeed.pipelines._loader import JaxLoader
    from slicefeed.pipelines._loader._orbax import JaxLoaderRestore, JaxLoaderSave
    from slicefeed.pipelines._mixture import interleave, mixture_report
    from slicefeed.pipelines._ops.placement import (
        apply_placement,
        placement_label_selector,
        preprocessing_placement,
    )
    from slicefeed.pipelines._ops.topology import SliceSpec
    from slicefeed.pipelines._pipeline import Pipeline, RunReport, load_pipeline
    from slicefeed.pipelines._spec import (
        apply_overrides,
        expand_uri_templates,
        fingerprint,
        load_spec,
        validate_spec,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "RECIPES",
    "JaxLoader",
    "JaxLoaderRestore",
    "JaxLoaderSave",
    "Pipeline",
    "RunReport",
    "SliceSpec",
    "apply_overrides",
    "apply_placement",
    "expand_uri_templates",
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
