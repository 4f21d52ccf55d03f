"""Save (mode "save") or restore (mode "restore") a train state plus JaxLoader state
with Orbax; prints the digests of the next batches as ``DIGESTS [...]``.

argv[1]: JSON {"mode", "uri", "ckpt", "kwargs", "take"}.
"""

import json
import sys

from tests._harness import configure_process_env

configure_process_env()

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from slicefeed.pipelines import JaxLoaderRestore, JaxLoaderSave
from tests.pipelines._conformance import digests


def main():
    cfg = json.loads(sys.argv[1])
    from slicefeed.pipelines import JaxLoader

    loader = JaxLoader(cfg["uri"], **cfg["kwargs"])
    mngr = ocp.CheckpointManager(cfg["ckpt"])
    if cfg["mode"] == "save":
        w = jnp.zeros(())
        for batch in digests_and_batches(loader, cfg["take"]):
            w = w + jnp.sum(batch["x"].astype(jnp.float32))
        mngr.save(1, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"w": w}), loader=JaxLoaderSave(loader)))
        mngr.wait_until_finished()
        print("W", float(w))
    else:
        abstract = {"w": jax.ShapeDtypeStruct((), jnp.float32)}
        out = mngr.restore(1, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), loader=JaxLoaderRestore(loader)))
        print("W", float(out.state["w"]))
    print("DIGESTS " + json.dumps(digests(loader)))
    mngr.close()


def digests_and_batches(loader, n):
    for i, b in enumerate(loader):
        yield b
        if i + 1 >= n:
            return


if __name__ == "__main__":
    main()
