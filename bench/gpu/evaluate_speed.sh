#!/usr/bin/env bash
# bench/evaluate_speed.py on one GPU: evaluate on the real SmolLM2-135M-Instruct (imported from its GGUF) beside the
# verifier's own batched greedy decoding of the same 64 prompts to 256 tokens, each side twice, with a draft trained
# elsewhere and carried (bench/gpu/stage_speed.sh trains one on the GPU instead, at the cost of ~5 minutes).
# The pipeline's wheels and the GGUF are the first ~123 MB of the vLLM carry (.carry1-3: bench/gpu/served.sh); the
# draft and the prompts travel as .carry-ev1, .carry-ev2, made here:
#   python bench/quality/prompts.py --train 64 --selection 64 --heldout 64 --output /tmp/ev/chat.jsonl
#   python bench/gpu/vllm_carry.py pack .carry-ev CHECKPOINT/config.json /tmp/ev/chat.jsonl CHECKPOINT/model.safetensors
# Back to back on a warm machine (device tool, repo root), one part a call, the bench in the call that completes them:
#   carry [".carry1"], [".carry2"], [".carry3"], [".carry-ev1"], [".carry-ev2"]:  bash bench/gpu/evaluate_speed.sh
# PARTS (default "speed"): "agreement" runs bench/evaluate_agreement.py on the same verifier and prompts first
# (where the batched decode and the uncached forward part), "agreement speed" both.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/evaluate-speed-out}
mkdir -p "$OUT"
python3 bench/gpu/vllm_carry.py stage /tmp/cs --into /tmp/cf | tail -1
python3 bench/gpu/vllm_carry.py stage /tmp/es --into /tmp/ef --family ev | tail -1
gguf=/tmp/cf/SmolLM2-135M-Instruct.Q4_1.gguf
{ [ -f "$gguf" ] && [ -f /tmp/ef/model.safetensors ] && [ -f /tmp/ef/config.json ]; } || exit 0
if [ ! -d /tmp/site/speculators ]; then
  python3 bench/gpu/vllm_carry.py install /tmp/cf /tmp/site --exclude vllm xgrammar llguidance
fi
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/ef/draft && cp /tmp/ef/config.json /tmp/ef/model.safetensors /tmp/ef/draft/
nvidia-smi -L
[ -f /tmp/verifier/config.json ] || python3 remote_scripts/import_verifier.py --source "$gguf" --output /tmp/verifier --dtype bfloat16 > "$OUT/import_verifier.log" 2>&1
if [[ " ${PARTS:-speed} " == *" agreement "* ]]; then
  python3 bench/evaluate_agreement.py --verifier /tmp/verifier --data /tmp/ef/chat.jsonl --prompts 64 --max-new-tokens 256 \
    --dtype bfloat16 ${AGREEMENT_ARGS:-} 2>&1 | grep -v -e 'Loading weights' | tee "$OUT/evaluate_agreement.log"
fi
[[ " ${PARTS:-speed} " == *" speed "* ]] || exit 0
python3 bench/evaluate_speed.py --verifier /tmp/verifier --draft /tmp/ef/draft --data /tmp/ef/chat.jsonl --prompts 64 --max-new-tokens 256 \
  --repeats 2 ${EVAL_ARGS:-} 2>&1 | grep -v -e 'Loading weights' -e 'speculators.utils.loading' | tee "$OUT/evaluate_speed.log"
