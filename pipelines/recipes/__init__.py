"""Built-in pipeline recipes (YAML specs shipped with the package).

- ``text_lm``: JSONL text -> tokenize -> pack to 2048 -> committed Parquet.
- ``image_classification``: images -> decode -> resize/crop/flip -> normalise.
- ``tabular``: CSV -> fill nulls -> standardise -> hash buckets.

``recipe_path(name)`` returns the YAML file, to load with
``slicefeed.pipelines.load_pipeline(recipe_path("text_lm"), overrides=[...])``.
"""

from __future__ import annotations

import os

from slicefeed.connectors import SpecError

RECIPES = ("text_lm", "image_classification", "tabular")


def recipe_path(name: str) -> str:
    """Path of the built-in recipe ``name`` (see :data:`RECIPES`).

    Raises:
        SpecError: listing the recipe names.
    """
    stem = name.removesuffix(".yaml")
    if stem not in RECIPES:
        raise SpecError(f"unknown recipe {name!r}; built-in recipes: {', '.join(RECIPES)}")
    return os.path.join(os.path.dirname(__file__), f"{stem}.yaml")


__all__ = ["RECIPES", "recipe_path"]
