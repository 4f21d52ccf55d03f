"""Built-in pipeline recipes (YAML)."""
