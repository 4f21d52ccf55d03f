"""A test-only local filesystem that kills the process opening a marked file.

``crashfs://<absolute path>`` is the local disk, except that

- reading from a file whose name contains ``CRASH`` (an input that crashes
  its reader, as a segfault in a decoder or an out-of-memory kill on a bomb
  would), and
- opening for writing a shard (``part-*``) into a folder whose name contains ``CRASH``

append a line to ``attempts.log`` two folders up (the test's temporary
folder) and end the process with ``os._exit``, every time. Importing this
module registers the protocol; a Ray worker defines and registers it when it
unpickles such a filesystem (the class itself holds a lock, so it cannot
travel by value).
"""

from __future__ import annotations

import sys

import ray.cloudpickle

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROTOCOL = "crashfs"


def _define() -> type:
    import os

    from fsspec.implementations.local import LocalFileSystem

    class CrashFileSystem(LocalFileSystem):
        protocol = (PROTOCOL,)

        def __init__(self, **kwargs):
            super().__init__(**{"auto_mkdir": True, **kwargs})

        def __reduce__(self):
            return filesystem, ()

        @classmethod
        def _strip_protocol(cls, path):
            path = str(path)
            if path.startswith(f"{PROTOCOL}://"):
                path = path[len(PROTOCOL) + 3:]
            return super()._strip_protocol(path)

        def unstrip_protocol(self, name: str) -> str:
            return f"{PROTOCOL}://{self._strip_protocol(name)}"

        def _open(self, path, mode="rb", **kwargs):
            p = self._strip_protocol(path)
            name, folder = os.path.basename(p), os.path.basename(os.path.dirname(p))

            def die(*_args, **_kwargs):
                log = os.path.join(os.path.dirname(os.path.dirname(p)), "attempts.log")
                with open(log, "a") as f:
                    f.write(f"{mode} {os.getpid()}\n")
                os._exit(77)

            if "w" in mode and name.startswith("part-") and "CRASH" in folder:
                die()
            f = super()._open(path, mode=mode, **kwargs)
            if "r" in mode and "CRASH" in name:
                f.read = f.readinto = f.read1 = f.readall = die
            return f

    return CrashFileSystem


def filesystem():
    """The crashing filesystem, registered in this process on first use."""
    import fsspec
    from fsspec.registry import registry

    if PROTOCOL not in registry:
        fsspec.register_implementation(PROTOCOL, _define())
    return fsspec.filesystem(PROTOCOL)


filesystem()
