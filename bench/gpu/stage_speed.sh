#!/usr/bin/env bash
# Issue 59 deliverable 3 on one GPU: two stages beside what they wrap, in one detached bench.
#   train:    our train stage against `speculators train` run directly, each twice, interleaved
#             (bench/gpu/speed.py --parts setup,train --train-pick 0,1,5,1: ours, direct, ours again, direct again),
#             2 epochs of 18 steps (--train-steps 36 --train-epochs 2: 31 steady steps a run, and one checkpoint
#             and validation fewer than 40 steps in 3 epochs; bench/RESULTS.md, bench/train_phases.py)
#   evaluate: on the real SmolLM2-135M-Instruct with a draft trained here (bench/quality/run.py --verifier smollm2,
#             ours alone, --stop-after train), against the verifier's own batched greedy decoding of the same
#             prompts to the same length (bench/evaluate_speed.py, each side twice)
# The pipeline's wheels and the GGUF are the first ~123 MB of the vLLM carry (bench/gpu/served.sh says how .carry1-6
# are made). Back to back on a warm machine (device tool, repo root):
#   1-2. carry [".carryN"]  bash bench/gpu/stage_speed.sh
#   3.   carry [".carry3"]  bash bench/gpu/stage_speed.sh        # the pipeline and the model are whole: the bench starts
#   4..  WAIT_S=540 bash bench/gpu/stage_speed.sh                # its log until it ends; what it made so far under $OUT
# SPEED_BUDGET_S (default 1000): the train part's budget, counted from its start (2026-12-06: 330 s let one of four runs finish)
# On a CPU (this repo's venv), the mechanics at toy sizes: QUICK=1 GGUF=FILE.gguf bash bench/gpu/stage_speed.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-/tmp/stage-speed-out}
results=${RESULTS:-/tmp/stage-speed-results} work=${WORK:-/tmp/stage-speed}
mkdir -p "$OUT" "$results"

if [ -z "${QUICK:-}" ]; then
  stage=/tmp/carry-stage files=/tmp/carry-files
  python3 bench/gpu/vllm_carry.py stage "$stage" --into "$files" | tail -1
  gguf=${GGUF:-$files/SmolLM2-135M-Instruct.Q4_1.gguf}
  export PYTHONPATH=/tmp/site:$REPO
  if [ ! -f /tmp/detached/stage-speed.pid ] && [ -f "$gguf" ]; then
    # the pipeline's wheels only: vLLM's, where they came too, are not needed here
    python3 bench/gpu/vllm_carry.py install "$files" /tmp/site --exclude vllm xgrammar llguidance
    nvidia-smi -L
    python3 -c 'import torch, transformers, speculators; print("torch", torch.__version__, "transformers", transformers.__version__, "speculators imports")'
    GGUF=$gguf bash bench/gpu/detached.sh start stage-speed env QUICK= RESULTS="$results" WORK="$work" bash bench/gpu/stage_speed.sh --bench
  fi
  [ -f /tmp/detached/stage-speed.pid ] || exit 0
  rc=0
  [ "${1:-}" = --bench ] || { bash bench/gpu/detached.sh wait stage-speed "${WAIT_S:-5}" || rc=$?; cp -r "$results"/. "$OUT/"; exit "$rc"; }
fi

if [ -n "${QUICK:-}" ] || [ "${1:-}" = --bench ]; then
  gguf=${GGUF:?GGUF=FILE.gguf}
  if [ -n "${QUICK:-}" ]; then
    speed=(--quick) steps=() size=ci evaluate=(--prompts 4 --max-new-tokens 16 --repeats 2) train=(--train-arg epochs=1)
  else
    speed=(--budget-s "${SPEED_BUDGET_S:-1000}") steps=(--train-steps 36 --train-epochs 2) size=gpu evaluate=(--prompts 64 --max-new-tokens 256 --repeats 2) train=(--train-arg epochs=3 --verifier-arg train=2048)
  fi
  echo "== evaluate: a draft trained on SmolLM2 ($size size), then evaluate beside decoding"
  python3 bench/quality/run.py --verifier smollm2 --size "$size" --gguf "$gguf" --workdir "$work" --skip-speculators \
    --stop-after train --no-record --json "${train[@]}" > "$results/quality.json" 2> "$results/quality.log" \
    || { tail -20 "$results/quality.log"; exit 1; }
  draft=$(ls -td "$work"/outputs/artifacts/train/*/ | head -1)
  echo "draft: $draft"
  python3 bench/evaluate_speed.py --verifier "$work/outputs/smollm2-verifier" --draft "$draft" --data "$work/outputs/chat.jsonl" \
    "${evaluate[@]}" 2>&1 | tee "$results/evaluate_speed.log"
  echo "== train: ours against \`speculators train\` direct, each twice"
  python3 bench/gpu/speed.py "${speed[@]}" --parts setup,train --train-pick 0,1,5,1 "${steps[@]}" --out "$results/speed" 2>&1 | tee "$results/speed.log"
fi
