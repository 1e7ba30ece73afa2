#!/usr/bin/env python3
"""Our `train` stage (remote_scripts/train_draft.py ARGS...), observed exactly as
speculators_direct.py observes `speculators train`: a handler on the root logger appends each
step's speculators metric record (its synchronised step profile included) to $BENCH_METRICS, and
the peak GPU memory at exit. Both sides of bench/gpu/speed.py's training ratio are read the same
way, also when the stage runs without its own per-step events (HARNESS_TRAIN_BENCH_WITHOUT=bridge)."""

import atexit
import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "remote_scripts"))

from speculators_direct import _peak_memory, _ToFile  # noqa: E402

if __name__ == "__main__":
    logging.getLogger().addHandler(_ToFile(os.environ["BENCH_METRICS"]))
    atexit.register(_peak_memory)
    import train_draft

    sys.exit(train_draft.main(sys.argv[1:]))
