"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI."""

from slicefeed.pipelines._loader import JaxLoader  # noqa: E402

__all__ = [*globals().get("__all__", []), "JaxLoader"]
