#!/usr/bin/env bash
# The toy Kimi-K2.5 end to end through `harness run` on this machine (issue 14): a local host with
# runtime "host" and every stage default; only the verifier stage is told to build the toy
# (make_tiny_verifier.py --arch kimi-k2.5). Two runs:
#   released         `harness run local demo`: builds the toy in the released checkpoint layout
#                    (language_model.model.layers.N..., text_config.model_type "kimi_k2"), then
#                    prepare, extract, train, evaluate, export
#   save_pretrained  the same weights as transformers' save_pretrained writes them, through
#                    `harness run local all` (prepare ... export)
# Prints tau per layout and writes $OUT/kimi_k25.json.
#
#   bash bench/gpu/kimi_k25.sh                          # on the GPU machine (.whl carried: installed first)
#   VERIFIER_ARGS='train_steps = 20' bash bench/gpu/kimi_k25.sh   # a quick mechanical check on a CPU
#   LAYOUTS=released bash bench/gpu/kimi_k25.sh          # one layout only (each is about 6 minutes
#   LAYOUTS=save_pretrained bash bench/gpu/kimi_k25.sh   # on an H200; both may not fit one 10-minute call)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/kimi-k25-out}
WORK=${WORK:-/tmp/kimi-k25-work}
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
nvidia-smi -L 2>/dev/null || echo "no GPU: CPU run"
python3 -c 'import torch, transformers, speculators; print("torch", torch.__version__, "transformers", transformers.__version__)'

project() {  # project DIR: a harness project with one local host whose workdir is DIR/work
  mkdir -p "$1"
  cp -r "$REPO/remote_scripts" "$1/remote_scripts"
  cat > "$1/harness.toml" <<EOF
[hosts.local]
local = true
workdir = "$1/work"
runtime = "host"
python = "$(command -v python3)"

[sync]
paths = ["remote_scripts"]

[pipeline]
verifier = "${2:-outputs/tiny-verifier}"

[pipeline.stages.verifier]
arch = "kimi-k2.5"
layout = "released"
${VERIFIER_ARGS:-}
EOF
}

harness() { python3 -m harness --config "$1/harness.toml" "${@:2}"; }

LAYOUTS=${LAYOUTS:-released save_pretrained}
started=$(date +%s)
project "$WORK/released"
harness "$WORK/released" sync local
released_s=0
if [[ " $LAYOUTS " == *" released "* ]]; then
harness "$WORK/released" run local demo
released_s=$(( $(date +%s) - started ))
else  # the toy verifier and its chat data only: the save_pretrained layout is made from them
harness "$WORK/released" run local verifier
fi

saved_s=0
if [[ " $LAYOUTS " == *" save_pretrained "* ]]; then
# The same weights in save_pretrained's layout, then every stage on them.
SAVED="$WORK/save_pretrained-verifier"
python3 - "$WORK/released/work/outputs/tiny-verifier" "$SAVED" <<'EOF'
import shutil, sys
sys.path.insert(0, "remote_scripts")
from common.verifier import load_verifier
src, dst = sys.argv[1:]
load_verifier(src).save_pretrained(dst)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tiny_language.json"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
EOF
started=$(date +%s)
project "$WORK/save_pretrained" "$SAVED"
mkdir -p "$WORK/save_pretrained/work/outputs"
cp "$WORK/released/work/outputs/chat.jsonl" "$WORK/save_pretrained/work/outputs/chat.jsonl"
harness "$WORK/save_pretrained" sync local
harness "$WORK/save_pretrained" run local all
saved_s=$(( $(date +%s) - started ))
fi

python3 - "$WORK" "$OUT/kimi_k25.json" "$released_s" "$saved_s" <<'EOF'
import json, sys
work, out, released_s, saved_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
results = {}
for layout, seconds in (("released", released_s), ("save_pretrained", saved_s)):
    if not seconds:
        continue
    report = json.load(open(f"{work}/{layout}/work/outputs/eval/report.json"))
    results[layout] = {"tau": report["tau"], "acceptance_per_position": report["acceptance_per_position"], "k": report["k"], "prompts": report["prompts"], "seconds": seconds}
    print(f"{layout}: tau = {report['tau']:.2f} at k = {report['k']} on {report['prompts']} held-out prompts ({seconds} s through harness run)")
json.dump(results, open(out, "w"), indent=2)
EOF
