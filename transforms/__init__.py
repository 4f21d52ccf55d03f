"""Arrow-native batch transforms (pa.Table -> pa.Table). Never imports jax."""
