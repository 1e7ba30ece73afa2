#!/usr/bin/env bash
# Issue 40's speed bench (bench/gpu/speed.py): on one H200 through the device tool (repo root,
# .whl carried: ../shared/gpu/fetch-wheels.sh .whl wheels.txt wheels-transformers.txt), or with
# --quick on a CPU (this repo's venv) to check it end to end.
set -euo pipefail
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [[ " $* " != *" --quick "* ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
out=${OUT:-/tmp/speed-bench-out}
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
python3 bench/gpu/speed.py "$@" 2>&1 | tee "$out/speed.log"
