#!/usr/bin/env python3
"""`speculators train ARGS...` run directly with its own defaults: the reference draft of the
quality bench. Nothing of our train stage is used; on a machine without an accelerator, only
the device shims of remote_scripts/common/speculators_compat.py are applied first (speculators'
trainer cannot start on a CPU without them; they change where tensors live, not the recipe)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "remote_scripts"))

if __name__ == "__main__":
    from common import speculators_compat

    speculators_compat.apply_cpu_shims()  # a no-op with an accelerator
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    main(TrainConfig.resolve(sys.argv[1:]))
