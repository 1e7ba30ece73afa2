#!/usr/bin/env bash
# On the GPU machine (device tool, repo root, .whl carried): install the wheels speculators 0.9.0
# needs there (../shared/gpu/fetch-wheels.sh fetched them), then run the GPU proof.
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L
python3 bench/gpu/gpu_bench.py "$@" 2>&1 | tee "${OUT:-/tmp}/gpu_bench.log"
