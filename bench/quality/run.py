#!/usr/bin/env python3
"""Draft quality on real text: tau of our draft against the baselines a user would pick instead.

    python bench/quality/run.py --size cpu|gpu [--json] [--workdir DIR]

1. A verifier of the Python standard library (remote_scripts/make_stdlib_verifier.py, no hub),
   and its chat data: prompts from training files (split train), prompts from held-out files
   (split heldout, never seen by the verifier or the drafts).
2. `harness run` on a local host (harness.jobs, as `harness demo` drives it): regenerate (the
   verifier writes the replies), prepare, extract, train (our recipe: the train stage's defaults
   plus this size's stage flags), evaluate (chain speculation on a few held-out prompts: a
   cross-check of step 4).
3. `speculators train` run directly with its own defaults on the same prepared data and hidden
   states (bench/quality/speculators_defaults.py; on a CPU the settings a CPU cannot run are
   replaced: draft attention sdpa, eager loss, no dataloader workers, 512-token packs).
4. bench/quality/measure.py: on the held-out prompts, with the same verifier and greedy decoding,
   tau_draft (ours), tau_ngram (vLLM's ngram prompt lookup, n = 4..1) and tau_speculators, at
   k = 3 and 5.
`--json` prints {"k", "tau_draft", "tau_ngram", "tau_speculators", ...} at k = 3; the table, with
the date, machine and load, goes to bench/RESULTS.md (unless --no-record).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

HEADING = "## bench/quality/run.py"


@dataclass(frozen=True)
class BenchSize:
    verifier_args: list[str]  # make_stdlib_verifier.py flags
    stage_args: dict[str, dict[str, Any]]  # [pipeline.stages.*] of the harness run
    max_seq_len: int
    measure_prompts: int
    measure_new_tokens: int
    speculators_cpu_args: list[str] = field(default_factory=lambda: ["--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0", "--total-seq-len", "512"])


def _stages(new_tokens: int, eval_prompts: int, train: dict[str, Any], threads: int | None, prepare: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    t = {"threads": threads} if threads else {}
    return {
        "regenerate": {"max_new_tokens": new_tokens, "batch_size": 64, **t},
        "prepare": dict(prepare or {}),
        "extract": {**t},
        "train": {**train, **t},
        "evaluate": {"max_prompts": eval_prompts, "max_new_tokens": new_tokens, **t},
    }


SIZES: dict[str, BenchSize] = {
    # CI: the whole path in a few minutes on 2 cores; a verifier this small still has structure.
    # (150 verifier steps and 3 draft epochs: n-gram 2.61 vs ours 2.49 at k = 3; the verifier's
    # replies were loops, which prompt lookup predicts as well as any draft.)
    "ci": BenchSize(["--size", "cpu", "--steps", "400", "--vocab-size", "1024", "--train-prompts", "128", "--heldout-prompts", "16", "--max-prompt-tokens", "192"],
                    _stages(48, 4, {"epochs": 6}, 1), 320, 16, 48),
    # The verifier's defaults (512 training prompts); prepare keeps 256 of them, so that
    # `speculators train`'s 20 default epochs fit the bench's time on 2 cores. 10 draft epochs:
    # tau 2.69 against 2.37 with the train stage's 3 on the same 64 prompts (bench/RESULTS.md).
    "cpu": BenchSize(["--size", "cpu"], _stages(96, 4, {"epochs": 10}, 1, prepare={"max_samples": 256}), 512, 64, 64),
    # Sized so that, after `--stop-after verifier` (about 5 minutes), the rest fits one 10-minute call.
    "gpu": BenchSize(["--size", "gpu", "--train-prompts", "2000", "--heldout-prompts", "64", "--max-prompt-tokens", "512"],
                     _stages(192, 16, {}, None), 1024, 64, 128, speculators_cpu_args=[]),
}


def log(msg: str) -> None:
    print(f"[quality] {msg}", file=sys.stderr, flush=True)


def run_logged(argv: list[str], log_path: Path, timeout: float) -> None:
    log(f"$ {' '.join(map(str, argv))}  (log {log_path})")
    with open(log_path, "ab") as f:
        proc = subprocess.run(list(map(str, argv)), stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{argv[1]} exited {proc.returncode}; log {log_path}:\n{tail}")


def build_verifier(size: str, spec: BenchSize, work: Path) -> dict:
    """make_stdlib_verifier.py once per workdir and size (its record says with which flags)."""
    out = work / "outputs"
    stamp = out / "stdlib-verifier" / "bench_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("args") == spec.verifier_args:
        log(f"verifier {out / 'stdlib-verifier'} already built with these flags")
    else:
        run_logged([sys.executable, REPO / "remote_scripts/make_stdlib_verifier.py", "--output", out / "stdlib-verifier", "--data-out", out / "chat.jsonl", *spec.verifier_args, "--events", work / "verifier.events.jsonl"], work / "verifier.log", 3600)
        stamp.write_text(json.dumps({"args": spec.verifier_args}))
    return json.loads((out / "stdlib-verifier" / "stdlib_split.json").read_text())["summary"]


def harness_run(spec: BenchSize, work: Path, stage_args: dict[str, dict[str, Any]]) -> dict:
    """regenerate, prepare, extract, train, evaluate through harness.jobs on a local host."""
    from harness.config import Config, HostConfig, PipelineConfig, SyncConfig
    from harness.jobs import Jobs
    from harness.sync import sync
    from harness.transport.local import LocalTransport

    host = HostConfig(name="local", local=True, workdir=str(work), runtime="host", python=sys.executable)
    pipeline = PipelineConfig(verifier="outputs/stdlib-verifier", data="outputs/chat.jsonl", output_dir="outputs", max_seq_len=spec.max_seq_len, speculative_tokens=3, stages=stage_args)
    config = Config(path=REPO / "harness.toml", hosts={"local": host}, sync=SyncConfig(paths=["remote_scripts"]), pipeline=pipeline)
    transport = LocalTransport("local")
    sync(transport, config.root, config.sync.paths, host.workdir, python=host.python)
    jobs = Jobs(config, host, transport)
    stages = ["regenerate", "prepare", "extract", "train", "evaluate"]
    run_id = jobs.start(stages)
    log(f"harness run {run_id}: {' -> '.join(stages)} (logs {work}/runs/{run_id}/)")
    status = jobs.wait(run_id, timeout=4 * 3600, poll_s=5.0)
    finished = {}
    for stage in stages:
        events_path = work / "runs" / run_id / stage / "events.jsonl"
        events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()] if events_path.exists() else []
        finished[stage] = next((e for e in reversed(events) if e.get("event") == "finished"), {})
    if status.state != "ok":
        failed = status.failed_stage
        raise SystemExit(f"harness run {run_id} ended {status.state}" + (f" in {failed.stage}: {finished.get(failed.stage, {}).get('error')}; log {work}/runs/{run_id}/{failed.stage}/log" if failed else ""))
    return {"run_id": run_id, "finished": finished}


def speculators_defaults(spec: BenchSize, work: Path) -> Path:
    out = work / "speculators-defaults"
    if any(d.name.isdigit() for d in out.glob("*")) and (out / "bench_done").exists():
        log(f"speculators defaults draft {out} already trained")
        return out
    argv = [
        sys.executable, REPO / "bench/quality/speculators_defaults.py",
        "--verifier-name-or-path", (work / "outputs/stdlib-verifier").resolve(),
        "--data-path", work / "outputs/prepared", "--hidden-states-path", work / "outputs/hidden_states",
        "--save-path", out, "--log-dir", out / "logs", *cpu_only(spec.speculators_cpu_args),
    ]
    run_logged(argv, work / "speculators-defaults.log", 4 * 3600)
    (out / "bench_done").write_text("")
    return out


def measure(work: Path, measure_args: list, checkpoint: str | None) -> dict:
    """bench/quality/measure.py, or its earlier result when it measured the same drafts (same
    arguments, same checkpoint) -- the slowest part on a CPU."""
    measured = work / "taus.json"
    key = {"args": list(map(str, measure_args)), "checkpoint": checkpoint}
    if measured.is_file():
        earlier = json.loads(measured.read_text())
        if earlier.get("bench_key") == key:
            log(f"reusing {measured}: the same drafts were measured with the same arguments")
            return earlier
    run_logged([sys.executable, REPO / "bench/quality/measure.py", *measure_args, "--output", measured], work / "measure.log", 4 * 3600)
    taus = json.loads(measured.read_text())
    measured.write_text(json.dumps({**taus, "bench_key": key}, indent=1))
    return taus


def cpu_only(args: list[str]) -> list[str]:
    import torch

    return [] if torch.cuda.is_available() else args


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="cpu")
    p.add_argument("--json", action="store_true", help="print the taus as JSON on stdout")
    p.add_argument("--workdir", default=None, help="where everything is written (default: ./quality-<size>)")
    p.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    p.add_argument("--stop-after", choices=["verifier"], default=None, help="build the verifier (kept in the workdir for the next call) and stop")
    p.add_argument("--skip-speculators", action="store_true", help="no `speculators train` reference (tau_speculators: null); the CI variant")
    p.add_argument("--train-arg", action="append", default=[], metavar="KEY=VALUE", help="an extra train-stage flag for our recipe (e.g. epochs=6); recorded with the figures")
    args = p.parse_args()
    spec = SIZES[args.size]
    work = Path(args.workdir or f"quality-{args.size}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load_before = os.getloadavg()

    summary = build_verifier(args.size, spec, work)
    log(f"verifier: {summary['parameters'] / 1e6:.1f}M parameters, held-out loss {summary['heldout_loss_per_token']} nats/token")
    if args.stop_after == "verifier":
        print(json.dumps({"verifier": summary}))
        return
    stage_args = {k: dict(v) for k, v in spec.stage_args.items()}
    for kv in args.train_arg:
        key, _, value = kv.partition("=")
        stage_args["train"][key.replace("-", "_")] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    run = harness_run(spec, work, stage_args)
    drafts = ["--draft", f"ours={work / 'outputs/checkpoints'}"]
    if not args.skip_speculators:
        drafts += ["--draft", f"speculators={speculators_defaults(spec, work)}"]
    taus = measure(work, [
        "--verifier", work / "outputs/stdlib-verifier", "--data", work / "outputs/chat.jsonl",
        *drafts, "--ks", "3", "5", "--max-prompts", spec.measure_prompts, "--max-new-tokens", spec.measure_new_tokens,
    ], run["finished"]["train"].get("checkpoint"))
    tau = {name: {int(k): round(r["tau"], 4) for k, r in by_k.items()} for name, by_k in taus["taus"].items()}
    tau.setdefault("speculators", {3: None, 5: None})
    result = {
        "k": 3,
        "tau_draft": tau["ours"][3],
        "tau_ngram": tau["ngram"][3],
        "tau_speculators": tau["speculators"][3],
        "k5": {"tau_draft": tau["ours"][5], "tau_ngram": tau["ngram"][5], "tau_speculators": tau["speculators"][5]},
        "size": args.size,
        "prompts": taus["prompts"],
        "verifier_heldout_loss_per_token": summary["heldout_loss_per_token"],
        "verifier_parameters": summary["parameters"],
        "evaluate_stage_tau": run["finished"]["evaluate"].get("tau"),
        "regenerate": {k: run["finished"]["regenerate"].get(k) for k in ("to_answer", "generated_tokens", "stopped_at_end_of_turn", "seconds")},
        "train_args": stage_args["train"],
        "seconds": round(time.monotonic() - t0, 1),
        "load_average": {"before": [round(x, 1) for x in load_before], "after": [round(x, 1) for x in os.getloadavg()]},
        "machine": machine(),
        "workdir": str(work),
    }
    (work / "result.json").write_text(json.dumps(result, indent=1))
    if not args.no_record:
        record(result, args)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))


def table(r: dict) -> str:
    rows = [("ours (harness train stage)", "tau_draft"), ("n-gram prompt lookup (vLLM ngram, n = 4..1)", "tau_ngram"), ("`speculators train`, its defaults", "tau_speculators")]
    lines = ["| proposer | tau, k = 3 | tau, k = 5 |", "| --- | ---: | ---: |"]
    lines += [f"| {label} | {_fmt(r[key])} | {_fmt(r['k5'][key])} |" for label, key in rows]
    return "\n".join(lines)


def _fmt(tau: float | None) -> str:
    return "not run" if tau is None else f"{tau:.3f}"


def record(r: dict, args) -> None:
    from results_file import record as write_section

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ratio = r["tau_draft"] / r["tau_ngram"] if r["tau_ngram"] else float("nan")
    section = (
        f"### {stamp}: `python bench/quality/run.py {' '.join(sys.argv[1:])}`\n\n"
        f"Machine: {r['machine']}; load average {r['load_average']['before']} before, {r['load_average']['after']} after; {r['seconds']:.0f} s in all. "
        f"Verifier: {r['verifier_parameters'] / 1e6:.1f}M parameters, held-out loss {r['verifier_heldout_loss_per_token']} nats/token. "
        f"{r['prompts']} held-out prompts, greedy; our train flags {json.dumps(r['train_args'])}; evaluate stage's own tau on its first prompts: {r['evaluate_stage_tau']}.\n\n"
        f"{table(r)}\n\ntau_draft / tau_ngram = {ratio:.2f} at k = 3 (goal >= 1.3); tau_draft - tau_speculators = {_fmt(r['tau_draft'] - r['tau_speculators']) if r['tau_speculators'] is not None else 'not measured'} (goal >= 0).\n"
    )
    write_section(HEADING, section)


if __name__ == "__main__":
    main()
