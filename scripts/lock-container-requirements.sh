#!/bin/sh
# Regenerate container/constraints.txt: resolve vllm + speculators + the pinned torch stack
# together from PyPI metadata (no install, no download of the big wheels), write every pin.
# usage: scripts/lock-container-requirements.sh   (from the repository root)
set -eu
OUT=$(mktemp /tmp/harness-lock.XXXXXX.json)
trap 'rm -f "$OUT"' EXIT
python3 -m pip install --dry-run --ignore-installed --quiet --report "$OUT" \
    vllm==0.33.0 speculators==0.9.0 torch==2.14.0 transformers==5.19.0 torchvision==0.29.0
python3 - "$OUT" <<'PY'
import json, re, sys
report = json.load(open(sys.argv[1]))
pins = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in report["install"])
path = "container/constraints.txt"
header = [l for l in open(path) if l.startswith("#")]
with open(path + ".tmp", "w") as f:
    f.writelines(header)
    f.writelines(f"{n}=={v}\n" for n, v in pins)
import os
os.replace(path + ".tmp", path)
print(f"{path}: {len(pins)} pins")
PY
