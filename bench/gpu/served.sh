#!/usr/bin/env bash
# Issue 58 (a) on one H200: bench/served.py --size gpu (SmolLM2 imported from its GGUF, a draft trained by
# our defaults on 2,048 prompts, serve_check's table: k 1-5 x concurrency 1, 4, 16, 64, 64 held-out prompts)
# on vLLM 0.26.0 (the newest that pins the image's torch 2.11.0), carried in parts.
#
# Here, once (what the image lacks, derived from the wheels' metadata: bench/gpu/vllm_carry.py derive):
#   python bench/gpu/vllm_carry.py derive /tmp/carry/whl --exclude flashinfer-python nvidia-cutlass-dsl quack-kernels tilelang \
#     tokenspeed-mla humming-kernels torchcodec pynvvideocodec fastsafetensors nvidia-cudnn-frontend opentelemetry-sdk \
#     opentelemetry-api opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai outlines-core lm-format-enforcer \
#     mcp anthropic mistral-common nvtx ray xgrammar apache-tvm-ffi
#   plus what vLLM imports at its start but derive cannot see (2026-12-06, on the H200): llguidance 1.7.6 (manylinux_2_31),
#   xgrammar==0.2.3 and apache-tvm-ffi==0.1.10 (0.2.9 wants tvm-ffi >= 0.1.11, vLLM pins 0.1.10); the vLLM wheel without
#   what a Hopper GPU never loads (FlashAttention 2, the SM100 sources, other Pythons' DeepGEMM, vllm-rs: 145 MiB instead
#   of 290; its MoE kernels stay, which Kimi-K2.5 needs): python bench/gpu/vllm_carry.py slim vllm-0.26.0-*.whl --into SLIM
#   python bench/gpu/vllm_carry.py pack .carry PIPELINE_WHEELS... SmolLM2-135M-Instruct.Q4_1.gguf VLLM_DEPS... \
#     llguidance-1.7.6-*.whl xgrammar-0.2.3-*.whl apache_tvm_ffi-0.1.10-*.whl vllm-0.26.0-*.whl
#   -> .carry1 ... .carry6 (56 MiB each, the last 41: one call each; echo '/.carry*/' >> .git/info/exclude)
# Then back to back on a warm machine (device tool, repo root; it goes back after 30 s idle):
#   1-2. carry [".carryN"]  bash bench/gpu/served.sh
#   3.   carry [".carry3"]  bash bench/gpu/served.sh   # the pipeline's wheels and the model are whole: the run starts, detached
#   4-6. carry [".carryN"]  bash bench/gpu/served.sh   # vLLM whole: installed where the run's serve_check will look
#   7..  WAIT_S=540 bash bench/gpu/served.sh           # the run's log until it ends; then its results in $OUT
# Each call unpacks what has come (a file is written once all its bytes are here, sha256 checked).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # the GPU model runner's sampler imports flashinfer otherwise (not carried)
OUT=${OUT:-/tmp/served-out}
stage=/tmp/carry-stage files=/tmp/carry-files work=/tmp/served-gpu
gguf=$files/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"
python3 bench/gpu/vllm_carry.py stage "$stage" --into "$files"

# install what has come and is not installed yet: the first batch (the pipeline) to /tmp/site, vLLM's to /tmp/site-vllm
install_new() { python3 bench/gpu/vllm_carry.py install "$files" "$1" --new-only; }
export PYTHONPATH=/tmp/site:/tmp/site-vllm:$REPO
if [ ! -f /tmp/detached/served.pid ] && [ -f "$gguf" ] && ls "$files"/speculators-*.whl >/dev/null 2>&1; then
  install_new /tmp/site
  nvidia-smi -L
  python3 -c "import torch, transformers, speculators; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__)" || true
  # SERVED_ARGS: a smaller run where the session's device time is short: 2,048 prompts train ~60 s an epoch on an
  # H200 (e.g. "--train-epochs 4 --k 1 2 3 --concurrency 1 16 64")
  # shellcheck disable=SC2086
  bash bench/gpu/detached.sh start served python3 bench/served.py --size gpu --gguf "$gguf" --workdir "$work" --no-record ${SERVED_ARGS:-}
fi
if [ -f "$files/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" ] && [ ! -d /tmp/site-vllm/vllm ]; then
  install_new /tmp/site-vllm
  python3 -c 'import vllm, vllm.entrypoints.openai.api_server; print("vllm", vllm.__version__, "imports")'
fi
[ -f /tmp/detached/served.pid ] || exit 0
rc=0
bash bench/gpu/detached.sh wait served "${WAIT_S:-5}" || rc=$?
# what the run made so far: the table, evaluate's report, the stages' logs and events
(cd "$work" 2>/dev/null && find . \( -name served.json -o -name speedup.png -o -name 'report*.json' -o -name log -o -name 'events.jsonl' -o -name run.json \) -size -4M \
   | tar czf "$OUT/served-gpu.tgz" -T - 2>/dev/null) || true
cp /tmp/detached/served.log "$OUT/served.log" 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader || true
exit "$rc"
