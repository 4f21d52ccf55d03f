"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI."""

from slicefeed.pipelines._topology import SliceSpec

__all__ = ["SliceSpec"]
