#!/usr/bin/env python3
"""`speculators train ARGS...` run directly (its own config resolver and trainer), with an
observer only: a handler on logger `speculators.metrics` appends each step's record (its
synchronised step profile included) to $BENCH_METRICS with its wall-clock time ("t"), and at exit
the peak GPU memory.
Nothing of harness or remote_scripts is imported: this is the reference side of the ratio."""

import atexit
import json
import logging
import os
import sys
import time


class _ToFile(logging.Handler):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "speculators.metrics" and isinstance(record.msg, dict):
            with open(self.path, "a") as f:
                # "t": when it was logged, so that bench/gpu/speed.py can tell a run's start-up, its
                # epochs' ends (checkpoint and validation) and its exit apart from its steps
                f.write(json.dumps({**record.msg, "t": round(record.created, 3)}, default=float) + "\n")


def _peak_memory() -> None:
    import torch

    with open(os.environ["BENCH_METRICS"], "a") as f:
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None
        f.write(json.dumps({"peak_memory_gb": peak, "t": round(time.time(), 3)}) + "\n")


if __name__ == "__main__":
    # On the root logger: speculators' dictConfig replaces the handlers of its own loggers, and
    # its metric records propagate up to the root.
    logging.getLogger().addHandler(_ToFile(os.environ["BENCH_METRICS"]))
    atexit.register(_peak_memory)
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    main(TrainConfig.resolve(sys.argv[1:]))
