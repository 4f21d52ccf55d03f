"""Subprocess: resume a JaxLoader from a saved state and print the batch digests.

argv[1]: JSON {"address": Ray GCS address, "uri": dataset, "kwargs": {...}, "state": {...}}
"""

import json
import sys

from tests._harness import configure_process_env

configure_process_env()

import ray

from slicefeed.pipelines import JaxLoader
from tests.pipelines._conformance import digests


def main():
    cfg = json.loads(sys.argv[1])
    ray.init(address=cfg["address"], log_to_driver=False, configure_logging=False)
    loader = JaxLoader(cfg["uri"], state=cfg["state"], **cfg["kwargs"])
    print("DIGESTS " + json.dumps(digests(loader)), flush=True)


if __name__ == "__main__":
    main()
