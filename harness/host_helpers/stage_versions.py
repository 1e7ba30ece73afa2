"""Library versions as the stages see them, for a run's record (started by the supervisor before
the run's first stage, in the stage environment: harness.jobs builds its command line through
harness/helpers.py).

stdin: {} (harness/helpers.py)  stdout: {name: version or null} for torch, transformers, speculators and vllm.
importlib.metadata imports none of them, so it takes milliseconds.
"""

import importlib.metadata as metadata
import json
import sys

DISTRIBUTIONS = ("torch", "transformers", "speculators", "vllm")


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.stdin.read()  # the request: nothing to ask
    json.dump({name: version(name) for name in DISTRIBUTIONS}, sys.stdout)
