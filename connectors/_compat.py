"""The one place that touches private Ray/JAX/gcsfs names.

Third-party imports are inside the functions, so importing slicefeed never
imports ray or jax. Each function is small and self-contained.
"""

from __future__ import annotations

import logging

# Ray's logger that warns, on every local ``ray.init``, that token
# authentication was switched on (or is off).
_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_ray_logging(verbose: bool) -> None:
    """Hides Ray's INFO lines and token-auth notice on the console unless ``verbose``.

    Ray Data's console handler (named ``console`` by its logging config) is
    raised to WARNING; its session log files under ``/tmp/ray/session_*/logs``
    keep everything. Call after ``import ray`` and before ``ray.init``.
    """
    import ray.data  # noqa: F401 - configures the "ray.data" logger

    level = logging.INFO if verbose else logging.WARNING
    for handler in logging.getLogger("ray.data").handlers:
        if handler.get_name() == "console":
            handler.setLevel(level)
    logging.getLogger(_RAY_AUTH_LOGGER).setLevel(logging.INFO if verbose else logging.ERROR)


def disable_ray_data_progress_bars() -> None:
    """Turns Ray Data's progress bars off without its "Progress bars disabled" warning.

    The warning is issued once per process under a ``log_once`` key;
    claiming that key first keeps it off the console.
    """
    from ray.data import DataContext
    from ray.util.debug import log_once

    DataContext.get_current().enable_progress_bars = False
    log_once("ray_data_progress_manager_disabled")
