"""Orbax integration: the loader's state saved and restored with the train state.

Usage (with ``orbax-checkpoint``, the ``orbax`` extra)::

    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), loader=JaxLoaderSave(loader)))
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), loader=JaxLoaderRestore(loader)))

Every process writes and reads its own small JSON file (``state_dict()``, the
same on every host). Restored on another number of processes, any saved file
is used: a committed dataset's loader re-splits the rest of the epoch among
the new hosts (other sources refuse another host count). Importing this
module imports orbax.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orbax.checkpoint as ocp


def _name() -> str:
    import jax

    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


def _item(item: Any, args: Any) -> Any:
    if args is not None:
        return args.item
    return item


class JaxLoaderCheckpointHandler(ocp.CheckpointHandler):
    """Saves ``loader.state_dict()`` per process; restoring calls ``load_state_dict``."""

    def save(self, directory, item: Any = None, args: Any = None) -> None:
        loader = _item(item, args)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / _name()).write_text(json.dumps(loader.state_dict()))

    def restore(self, directory, item: Any = None, args: Any = None) -> Any:
        loader = _item(item, args)
        path = directory / _name()
        if not path.exists():
            # Saved on another number of processes: every process saves the same
            # state, and a committed dataset's loader resumes it on this layout.
            saved = sorted(p for p in directory.glob("process_*-of-*.json"))
            if not saved:
                raise FileNotFoundError(
                    f"JaxLoader: no loader state {path} in the checkpoint (it holds no "
                    "process_*-of-*.json: was the loader saved in it?)."
                )
            path = saved[0]
        state = json.loads(path.read_text())
        loader.load_state_dict(state)
        return loader

    def metadata(self, directory) -> None:
        return None


@ocp.args.register_with_handler(JaxLoaderCheckpointHandler, for_save=True)
@dataclasses.dataclass
class JaxLoaderSave(ocp.args.CheckpointArgs):
    """Orbax args: save this loader's position."""

    item: Any


@ocp.args.register_with_handler(JaxLoaderCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class JaxLoaderRestore(ocp.args.CheckpointArgs):
    """Orbax args: restore this loader to the saved position (``load_state_dict``)."""

    item: Any
