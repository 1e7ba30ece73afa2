#!/usr/bin/env bash
# Issue 13's GPU proof: the demo chain with every default, as a new user runs it through the CLI
# (`harness sync` + `harness run HOST demo` on a local host, runtime "host"), then the evaluate
# stage's tau at k = 3 and the train stage's tau estimates (training_tau).
#
#   bash bench/gpu/demo_quality.sh [EXTRA.toml]   (device tool, repo root; carry .whl: wheels.txt + wheels-cli.txt)
#
# EXTRA.toml, appended to the generated harness.toml, is for checking this script's mechanics on a
# CPU in a few minutes (bench/gpu/demo_quality_cpu_check.toml); the proof takes no argument.
#
# Writes $OUT/demo_quality.json ({"tau", "acceptance_per_position", "checkpoint", "training_tau",
# "recipe", "warnings", "seconds", "device"}) and copies report.json, training.png,
# acceptance.png and the train stage's log there. Runs on a CPU as well (minutes on 2 cores).
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/demo-quality-out}
mkdir -p "$out"
if [ -d "$repo/.whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

work=$(mktemp -d /tmp/demo-quality.XXXXXX)
# The config lives at the repo root (sync paths are relative to it); removed on exit.
cfg="$repo/.demo-quality-$$.toml"
trap 'rm -f "$cfg"' EXIT
cat >"$cfg" <<EOF
[hosts.box]
local = true
workdir = "$work"
runtime = "host"
python = "$(command -v python3)"

[sync]
paths = ["remote_scripts"]
EOF
if [ $# -gt 0 ]; then cat "$1" >>"$cfg"; fi
harness() { python3 -m harness --config "$cfg" "$@"; }

device=$( (nvidia-smi -L 2>/dev/null || echo "cpu: $(nproc) cores") | head -1)
echo "device: $device"
started=$(date +%s)
harness sync box
rc=0
harness run box demo >"$out/run.stdout" || rc=$?   # stdout: the run id, then the stages' logs
run_id=$(head -1 "$out/run.stdout")
seconds=$(( $(date +%s) - started ))
harness status box "$run_id" || true
[ "$rc" = 0 ] || echo "harness run exited $rc" >&2

cp "$work/runs/$run_id/train/log" "$out/train.log" 2>/dev/null || true
for f in report.json training.png acceptance.png; do cp "$work/outputs/eval/$f" "$out/" 2>/dev/null || true; done
python3 - "$work" "$run_id" "$seconds" "$device" "$out/demo_quality.json" <<'EOF'
import json, sys
from pathlib import Path

work, run_id, seconds, device, dest = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
report = json.loads((work / "outputs/eval/report.json").read_text())
train_events = [json.loads(l) for l in (work / "runs" / run_id / "train/events.jsonl").read_text().splitlines() if l.strip()]
result = {
    "run_id": run_id,
    "device": device,
    "seconds": seconds,
    "tau": round(report["tau"], 4),
    "k": report["k"],
    "acceptance_per_position": report["acceptance_per_position"],
    "checkpoint": report["extra"].get("checkpoint"),
    "training_tau": report["extra"].get("training_tau"),
    "recipe": [e["text"] for e in train_events if e["event"] == "message" and e["text"].startswith("recipe:")],
    "warnings": [e["text"] for e in train_events if e["event"] == "warning"],
    "train_steps": next((e.get("steps") for e in train_events if e["event"] == "finished"), None),
}
dest.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
print(f"tau {result['tau']:.2f} at k = {result['k']} ({'meets' if result['tau'] >= 3.5 else 'MISSES'} the 3.5 target); "
      f"training_tau {[round(t['tau'], 2) for t in result['training_tau'] or []]}")
EOF
