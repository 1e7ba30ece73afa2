#!/usr/bin/env bash
# bench/gpu/synthetic_served.py on one GPU: vLLM 0.26.0 carried as bench/gpu/served.sh carries it (the same .carry1-6),
# then an 8B-shaped verifier with random weights served alone and with a draft at the acceptance serve_check measured.
#   1-6. carry [".carryN"] (and ".carry-tok": SmolLM2's tokenizer.json and tokenizer_config.json)  bash bench/gpu/synthetic_served.sh
#   then SYNTH_DEADLINE_S=540 bash bench/gpu/synthetic_served.sh   (vLLM is whole: the bench runs)
# The last call (vLLM whole) runs the bench inside SYNTH_DEADLINE_S. Its log, vLLM's logs and its JSON are written under
# $OUT as they come, so a call cut at its limit still brings back how far it got (2026-12-06: an H100 call of 320 s,
# after a fresh machine's start and vLLM's install, returned nothing when the log went through a pipe).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/synthetic-out}
stage=/tmp/carry-stage files=/tmp/carry-files
mkdir -p "$OUT" /tmp/tok
[ -d .carry-tok ] && cp .carry-tok/* /tmp/tok/
python3 bench/gpu/vllm_carry.py stage "$stage" --into "$files" | tail -1
[ -f "$files/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" ] || exit 0
[ -d /tmp/site-vllm/vllm ] || python3 bench/gpu/vllm_carry.py install "$files" /tmp/site-vllm --new-only
export PYTHONPATH=/tmp/site-vllm
nvidia-smi -L
# shellcheck disable=SC2086
exec python3 bench/gpu/synthetic_served.py --tokenizer /tmp/tok --rates ${SYNTH_RATES:-0.549 0.343 0.221} --workdir "$OUT/synthetic" \
  --deadline-s "${SYNTH_DEADLINE_S:-400}" --out "$OUT/synthetic-served.json" ${SYNTH_ARGS:-} > "$OUT/synthetic-served.log" 2>&1
