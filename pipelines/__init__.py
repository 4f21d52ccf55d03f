"""Pipelines: specs, Ray Dataset building, batch jobs, the JAX loader, the CLI."""
