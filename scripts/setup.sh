#!/usr/bin/env bash
# Installs harness and what the local demo pipeline needs, into the current Python environment.
#   scripts/setup.sh          harness + the pipeline extra (torch CPU, transformers, speculators)
#   scripts/setup.sh --dev    the same plus the test tools
# Why a script and not just `pip install .[pipeline]`: speculators 0.9.0 requires torchvision and
# torchaudio, whose PyPI builds fail to load beside a CPU torch (and transformers imports
# torchvision when it is present). torch is pinned (2.13.0) so nothing upgrades it to a 4 GB CUDA
# build; the two are removed again afterwards: speculators imports neither.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="pipeline"
[ "${1:-}" = "--dev" ] && extras="pipeline,dev"
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -e ".[${extras}]"
python3 -m pip uninstall -q -y torchvision torchaudio >/dev/null 2>&1 || true
python3 - <<'PY'
from importlib.metadata import version

import speculators, torch, transformers  # noqa: F401  (fails loudly if the install is broken)
print(f"setup ok: torch {torch.__version__}, transformers {transformers.__version__}, speculators {version('speculators')}")
PY
