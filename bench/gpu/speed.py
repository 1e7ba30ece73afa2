#!/usr/bin/env python3
"""Issue 40's speed bench: the four stages against what they should match, in one call.

    bash bench/gpu/speed.sh            # on one H200: wheels, then this (<= 8 minutes)
    bash bench/gpu/speed.sh --quick    # toy sizes on a CPU: proves the script end to end

Parts (in this order; each prints its rows at once, and results.json and the table are
rewritten after each, so a run stopped by its time limit still returns what it measured; a part
whose estimate would end past --budget-s is skipped):
  setup       a Llama-3.1-8B-width verifier with --layers layers (random weights), prepared rows
              at --seq-len, and the train part's hidden states (the extract stage, small)
  evaluate    remote_scripts/evaluate.py's fast method (measure_fast) on 64 random prompts with
              a random SmolLM2-135M-shaped verifier and an untrained draft (acceptance ~0: the
              most rounds, the pessimistic case); tokens/s, rounds, generate calls; the chain
              method on the first prompts beside it (same rounds and acceptances?)
  regenerate  regenerate.py's transformers backend on --regen-prompts random prompts (SmolLM2
              shape, greedy, --regen-new-tokens each): the old defaults (a prompt-token cap of
              16384 per batch) against the new ones (memory-sized batches), and a static cache
  extract     the extract stage's loop (extract_transformers, in this process) against the
              forward-only rate of the same model on the same batches, >= --extract-tokens
              tokens; steady rates (after the first batches) apart from the fixed costs (load,
              pinned buffers, final drain). A sink deletes each file once written, as training
              would consume it: 2M tokens of an 8B model are 64 GB, more than the disk; this
              measures the stage's pipeline, not the disk
  train       our train stage (bench/gpu/train_observed.py) against `speculators train` direct
              (speculators_direct.py) with the argv our stage passed it, then our stage with
              each extra left out (--loss-on replies; HARNESS_TRAIN_BENCH_WITHOUT=bridge, walk):
              the per-step cost of each; the median of steady steps of speculators' own
              synchronised step profile on both sides
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "remote_scripts"))

import gpu_bench as gb  # noqa: E402
from gpu_bench import Row  # noqa: E402

ORDER = ["setup", "evaluate", "regenerate", "extract", "train", "static"]
# Seconds per part on one H200 (estimates; a part that would end past --budget-s is skipped).
ESTIMATE_S = {"setup": 70, "evaluate": 40, "regenerate": 50, "extract": 100, "train": 120, "static": 150}
ISSUE = {"evaluate_s": 160.7, "regenerate_tps": 2250.0}  # issue 40's figures on an H200

SMOL = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152}
QUICK_VOCAB = 2048  # --quick: bf16 matmuls over SmolLM2's 49,152 rows crawl on a CPU without bf16 units
EOS = 2  # SmolLM2's <|im_end|>; a random model rarely says it, so replies run to the budget


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sync() -> None:
    if cuda():
        import torch

        torch.cuda.synchronize()


def emit(rows: list[Row], row: Row) -> None:
    rows.append(row)
    print(row.line(), flush=True)


# ---------------------------------------------------------------------------------------------
# setup


def part_setup(work: Path, args, rows, results) -> None:
    shape = gb.TINY_SHAPE if args.quick else gb.FULL_SHAPE
    t0 = time.monotonic()
    gb.make_verifier(work / "verifier", args.layers, shape)
    results["verifier_s"] = round(time.monotonic() - t0, 1)
    results["tokens_train"] = gb.make_prepared(work / "prepared_train", args.train_samples, args.seq_len)
    results["tokens_extract"] = gb.make_prepared(work / "prepared_extract", -(-args.extract_tokens // args.seq_len), args.seq_len)
    if not (work / "hidden_states" / "extract_meta.json").exists():
        cmd = [sys.executable, str(REPO / "remote_scripts" / "extract_hidden_states.py"), "--verifier", str(work / "verifier"),
               "--prepared", str(work / "prepared_train"), "--output", str(work / "hidden_states"), "--batch-size", "8"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------
# evaluate


def smol_shape(args) -> dict:
    return {**SMOL, "vocab_size": QUICK_VOCAB} if args.quick else SMOL


def smol_model(shape: dict, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**shape, "num_hidden_layers": layers}, tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=EOS)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dev = gb.device()
    with torch.device(dev):
        model = LlamaForCausalLM(config)
    # the stages' dtype rule (common/verifier.py): bf16 on a GPU, fp32 on CPU
    return model.to(torch.bfloat16 if dev.startswith("cuda") else torch.float32).eval()


def untrained_draft(shape: dict, layers: list[int]):
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(**{**shape, "num_hidden_layers": 1}, head_dim=shape["hidden_size"] // shape["num_attention_heads"])
    layer._attn_implementation = "sdpa"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=shape["vocab_size"], norm_before_residual=True, eagle_aux_hidden_state_layer_ids=layers,
        speculators_config=SpeculatorsConfig(algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                                             default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=None, architectures=[])),
    )
    torch.manual_seed(1)
    draft = Eagle3DraftModel(config)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0.0, 0.02)
    return draft.to(gb.device(), torch.bfloat16).eval()


def random_prompts(n: int, low: int, high: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(low, high))] for _ in range(n)]


def part_evaluate(work: Path, args, rows, results) -> None:
    import torch

    import evaluate as ev

    layers_n = 8 if args.quick else SMOL["num_hidden_layers"]
    shape = smol_shape(args)
    model = smol_model(shape, layers_n)
    layers = [2, layers_n // 2, layers_n - 3]
    verifier = ev.HFVerifier(model, layers, torch.bfloat16)
    proposer = ev.Eagle3Proposer(untrained_draft(shape, layers))
    n, k, new = (8, 3, 24) if args.quick else (64, 3, 96)
    prompts = random_prompts(n, 16, 48, shape["vocab_size"]) if args.quick else random_prompts(n, 32, 256, shape["vocab_size"])
    batch = min(8, n) if not cuda() else verifier.batch_size(prompts, new + k + 1)
    ev.measure_fast(verifier, proposer, prompts[:2], k, 8, {EOS}, 2)  # kernels' first use
    verifier.decodes = 0
    phases = PhaseClock()
    with phases.watching(ev, verifier):
        sync()
        t0 = time.perf_counter()
        fast = ev.measure_fast(verifier, proposer, prompts, k, new, {EOS}, batch)
        sync()
        seconds = time.perf_counter() - t0
    if args.evaluate_profile:
        profile_evaluate(ev, verifier, proposer, prompts[:8], k, new, batch, Path(args.out))
    tokens = sum(len(r.generated) for r in fast)
    rounds = sum(r.rounds for r in fast)
    chain_n = 2 if args.quick else args.evaluate_chain_prompts
    t1 = time.perf_counter()
    chain = [ev.speculate(verifier, proposer, p, k, new, {EOS}) for p in prompts[:chain_n]]
    chain_s = time.perf_counter() - t1
    same = sum((f.generated, f.rounds, f.accepted, f.trials) == (c.generated, c.rounds, c.accepted, c.trials) for f, c in zip(fast, chain))
    results["evaluate"] = {"prompts": n, "seconds": round(seconds, 2), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1), "rounds": rounds,
                           "tau": round(ev.summarize(fast, k).tau, 3), "generate_calls": verifier.decodes, "batch_size": batch,
                           "greedy_match": sum(bool(r.greedy_match) for r in fast), "chain_prompts": chain_n, "chain_identical": same,
                           "chain_tokens_per_s": round(sum(len(c.generated) for c in chain) / chain_s, 1), "phases_s": phases.seconds, "phase_calls": phases.calls}
    print("evaluate phases (s, calls): " + ", ".join(f"{n} {t:.2f} ({phases.calls[n]})" for n, t in phases.seconds.items()), flush=True)
    e = results["evaluate"]
    emit(rows, Row(f"evaluate --method fast, {n} prompts, SmolLM2-135M shape random, untrained draft: seconds ({e['tokens_per_s']:,.0f} tokens/s, "
                   f"{rounds} rounds, tau {e['tau']}, {verifier.decodes} generate calls, greedy {e['greedy_match']}/{n}; chain identical on {same}/{chain_n}, "
                   f"chain {e['chain_tokens_per_s']:,.0f} tokens/s)", f"{seconds:.1f} s", f"{ISSUE['evaluate_s']} s (issue 40)",
                   ISSUE["evaluate_s"] / seconds, "<= 16 s (>= 10)"))
    del model, verifier, proposer
    if cuda():
        torch.cuda.empty_cache()


class PhaseClock:
    """Seconds spent in each of measure_fast's phases (synchronised): the verifier's generate
    calls, its forwards (forward_many: batched on a GPU; on a CPU it calls forward, counted in
    both), the draft's chain tables, the replays."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def _timed(self, name: str, fn):
        def timed(*a, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                sync()
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 3)
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    METHODS = ("greedy", "greedy_batch", "forward", "forward_many")

    @contextlib.contextmanager
    def watching(self, ev, verifier):
        saved = {n: getattr(ev, n) for n in ("chain_tables", "replay")}  # chain_tables: the draft's runs, packed on a GPU or one a prompt
        for n, fn in saved.items():
            setattr(ev, n, self._timed(n, fn))
        for n in self.METHODS:
            setattr(verifier, n, self._timed(n, getattr(verifier, n)))
        try:
            yield
        finally:
            for n, fn in saved.items():
                setattr(ev, n, fn)
            for n in self.METHODS:
                delattr(verifier, n)  # the instance's timed copy: the class's method shows again


def profile_evaluate(ev, verifier, proposer, prompts, k: int, new: int, batch: int, out: Path) -> None:
    """torch.profiler's table of measure_fast on a few prompts (--evaluate-profile): where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda() else [])
    with profile(activities=activities) as prof:
        ev.measure_fast(verifier, proposer, prompts, k, new, {EOS}, min(batch, len(prompts)))
        sync()
    for key in ("cpu_time_total", "cuda_time_total" if cuda() else "self_cpu_time_total"):
        (out / f"evaluate_profile_{key}.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=40))


# ---------------------------------------------------------------------------------------------
# regenerate


class _NoTokenizer:
    """regenerate's backend decodes replies to text; the bench needs only their token counts."""

    pad_token_id = None

    def decode(self, tokens, skip_special_tokens=True) -> str:
        return ""


REGEN_VARIANTS = {"old defaults (batches capped at 16,384 prompt tokens)": {"max_batch_tokens": 16384, "cache": "dynamic"},
                  "new defaults (memory-sized batches)": {"max_batch_tokens": 0, "cache": "dynamic"},
                  "new defaults + --cache static (transformers compiles the decode)": {"max_batch_tokens": 0, "cache": "static"}}


def part_regenerate(work: Path, args, rows, results, names: list[str] | None = None) -> None:
    import torch

    import regenerate as rg

    shape = smol_shape(args)
    model = smol_model(shape, 8 if args.quick else SMOL["num_hidden_layers"])
    low, high = (16, 64) if args.quick else (32, 512)
    prompts = dict(enumerate(random_prompts(args.regen_prompts, low, high, shape["vocab_size"], seed=1)))
    results.setdefault("regenerate", {})
    for name in names or list(REGEN_VARIANTS)[:2]:
        backend = object.__new__(rg.TransformersBackend)
        backend.torch, backend.model, backend.eos, backend.tokenizer = torch, model, {EOS}, _NoTokenizer()
        backend.device = gb.device()
        backend.args = argparse.Namespace(batch_size=0, max_new_tokens=args.regen_new_tokens, temperature=0.0, top_p=1.0, seed=0, **REGEN_VARIANTS[name])
        tokens, batches = [0], [0]

        def on_batch(replies, tokens=tokens, batches=batches):
            tokens[0] += sum(r.tokens for r in replies.values())
            batches[0] += 1

        sync()
        t0 = time.perf_counter()
        try:
            backend.generate(prompts, on_batch)
        except Exception as e:  # a variant that does not work here is a finding, not the end of the bench
            results["regenerate"][name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            print(f"regenerate {name}: {results['regenerate'][name]}", flush=True)
            continue
        sync()
        seconds = time.perf_counter() - t0
        v = results["regenerate"][name] = {"seconds": round(seconds, 2), "tokens": tokens[0], "tokens_per_s": round(tokens[0] / seconds, 1), "batches": batches[0]}
        print(f"regenerate {name}: {v}", flush=True)
        old = results["regenerate"].get(list(REGEN_VARIANTS)[0])
        if isinstance(old, dict) and v is not old:
            emit(rows, Row(f"regenerate, transformers backend, {name}: tokens/s ({len(prompts)} random prompts of {low}-{high} tokens, greedy, "
                           f"<= {args.regen_new_tokens} new tokens, {v['batches']} batches, {v['seconds']} s; SmolLM2-135M shape)",
                           f"{v['tokens_per_s']:,.0f}", f"{old['tokens_per_s']:,.0f} (old defaults)", v["tokens_per_s"] / old["tokens_per_s"], ">= 3"))
    del model
    if cuda():
        torch.cuda.empty_cache()


def part_static(work: Path, args, rows, results) -> None:
    """regenerate with --cache static, last: its compilation is the most expensive and least sure."""
    if args.quick:
        results["regenerate_static"] = "not run: transformers compiles the decode only on an accelerator"
        return
    part_regenerate(work, args, rows, results, [list(REGEN_VARIANTS)[2]])


# ---------------------------------------------------------------------------------------------
# extract


class _TimedEvents:
    """The stage's EventLog, keeping when each progress event came (monotonic) in memory."""

    def __init__(self, path: Path):
        from common.events import EventLog

        self.log = EventLog("extract", str(path), echo=False)
        self.progress_at: list[tuple[float, int]] = []
        self.messages: list[str] = []

    def progress(self, done: int, total: int, unit: str = "samples") -> None:
        self.progress_at.append((time.monotonic(), done))

    def message(self, text: str) -> None:
        self.messages.append(text)

    def __getattr__(self, name):
        return getattr(self.log, name)


def _sink(output: Path, stop: threading.Event, removed: list[int]) -> None:
    """Deletes each finished file (final name, after the stage's rename), as training would
    consume it: the page cache never writes them back, and the disk never fills."""
    while not stop.is_set():
        for f in output.glob("hs_*.safetensors"):
            f.unlink(missing_ok=True)
            removed[0] += 1
        stop.wait(0.05)


def steady(points: list[tuple[float, int]], skip: int) -> float | None:
    """Units per second between the `skip`-th point and the last."""
    if len(points) <= skip + 1:
        return None
    (t0, n0), (t1, n1) = points[skip], points[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else None


def part_extract(work: Path, args, rows, results) -> None:
    import torch
    from datasets import load_from_disk

    import extract_hidden_states as xh
    from common.hidden_state_capture import HiddenStateCapture
    from common.sharding import plan_batches
    from common.verifier import default_target_layers, load_verifier, locate_decoder

    prepared = work / "prepared_extract"
    ds = load_from_disk(str(prepared))
    ds.set_format(type="torch")
    lengths = {i: int(ds[i]["seq_len"]) for i in range(len(ds))}
    batches = plan_batches(lengths, args.extract_batch_size, args.extract_max_batch_tokens)
    dev = gb.device()

    # forward-only: the capture forward and the bf16 stack, no copy to the host, no files
    t0 = time.monotonic()
    model = load_verifier(str(work / "verifier"), device=dev, dtype="auto")
    parts = locate_decoder(model)
    capture = HiddenStateCapture(parts, default_target_layers(parts.num_layers))
    load_s = time.monotonic() - t0
    points = []
    with torch.inference_mode():
        sync()
        for b in batches:
            ids = torch.stack([ds[i]["input_ids"] for i in b]).to(dev)
            capture.run(ids, torch.ones_like(ids)).to(torch.bfloat16)
            if len(points) < args.extract_skip_batches + 1:
                sync()  # the start of the steady window is exact; after it the GPU runs ahead
            points.append((time.monotonic(), sum(lengths[i] for i in b)))
        sync()
        points[-1] = (time.monotonic(), points[-1][1])
    cum, forward_points = 0, []
    for t, n in points:
        cum += n
        forward_points.append((t, cum))
    forward_tps = steady(forward_points, args.extract_skip_batches)
    capture.close()
    del model, capture, parts
    if cuda():
        torch.cuda.empty_cache()

    # the stage's loop, its own model load, pinned buffers, writers and drain
    output = work / "extract_out"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    xargs = xh.parse_args(["--verifier", str(work / "verifier"), "--prepared", str(prepared), "--output", str(output),
                           "--batch-size", str(args.extract_batch_size), "--max-batch-tokens", str(args.extract_max_batch_tokens)])
    events = _TimedEvents(work / "extract_events.jsonl")
    stop, removed = threading.Event(), [0]
    sink = threading.Thread(target=_sink, args=(output, stop, removed), daemon=True)
    if not args.extract_keep_files:
        sink.start()
    t0 = time.monotonic()
    try:
        summary = xh.extract_transformers(xargs, events, ds, range(len(ds)), 0, 0)
    finally:
        stop.set()
        if sink.is_alive():
            sink.join()
    stage_s = time.monotonic() - t0
    seq = args.seq_len
    stage_points = [(t, done * seq) for t, done in events.progress_at]  # rows are all seq_len long
    # progress counts rows, the batch plan's first batches hold extract_batch_size rows each
    stage_tps = steady(stage_points, args.extract_skip_batches)
    tokens = sum(lengths.values())
    fixed = stage_s - summary["loop_seconds"]
    ratio = stage_tps / forward_tps if stage_tps and forward_tps else None
    results["extract"] = {"tokens": tokens, "layers": args.layers, "seq_len": seq, "batches": len(batches), "forward_only_steady_tps": forward_tps,
                          "stage_steady_tps": stage_tps, "stage_end_to_end_tps": summary["tokens_per_s"], "stage_seconds": round(stage_s, 2),
                          "load_and_setup_s": round(fixed, 2), "forward_only_load_s": round(load_s, 2), "loop_seconds": summary["loop_seconds"],
                          "final_drain_s": summary["final_drain_s"], "waited_for_writer_s": summary["waited_for_writer_s"],
                          "writer_threads": summary["writer_threads"], "files_deleted_by_sink": removed[0], "messages": events.messages}
    emit(rows, Row(f"extraction steady tokens/s, the stage's loop vs forward-only ({tokens:,} tokens, Llama-3.1-8B width, {args.layers} layers, seq {seq}; "
                   f"files {'deleted once written (pipeline, not disk)' if not args.extract_keep_files else 'kept'}; blocked on writers {summary['waited_for_writer_s']} s)",
                   f"{stage_tps:,.0f}" if stage_tps else "n/a", f"{forward_tps:,.0f}" if forward_tps else "n/a", ratio, ">= 0.95"))
    emit(rows, Row(f"extraction fixed costs: load + pinned buffers + warm-up {fixed:.1f} s, final drain {summary['final_drain_s']} s; "
                   f"end to end {summary['tokens_per_s']:,.0f} tokens/s over the loop's {summary['loop_seconds']} s",
                   f"{stage_s:.1f} s", f"{tokens / forward_tps:.1f} s forward-only" if forward_tps else "n/a", None, "report"))
    shutil.rmtree(output, ignore_errors=True)
    if cuda():
        torch.cuda.empty_cache()  # the train part's processes get the GPU's memory back


# ---------------------------------------------------------------------------------------------
# train


def train_argv(work: Path, args, out: str, loss_on: str = "all") -> list[str]:
    a = gb.train_args(work, argparse.Namespace(train_epochs=args.train_epochs, total_seq_len=args.total_seq_len), out, processes=1, prepared=str(work / "prepared_train"))
    argv = ["--verifier", str(work / "verifier"), "--events", str(work / f"{out}.events.jsonl"), "--max-steps", str(args.train_steps), "--loss-on", loss_on]
    for k, v in a.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return argv


def run_observed(work: Path, script: str, argv: list[str], name: str, env_extra: dict) -> tuple[list[dict], str]:
    metrics = work / f"{name}.metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "BENCH_METRICS": str(metrics), **({"CUDA_VISIBLE_DEVICES": "0"} if cuda() else {}), **env_extra}
    proc = subprocess.run([sys.executable, str(HERE / script), *argv], env=env, cwd=str(work), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-4000:])
        raise SystemExit(f"{name} failed with exit code {proc.returncode}")
    lines = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    return lines, proc.stdout + proc.stderr


def step_rates(lines: list[dict]) -> list[float]:
    return [ln["profile"]["tokens_per_s"] for ln in lines if (ln.get("profile") or {}).get("tokens_per_s")]


STEP_PARTS = ("queue", "h2d", "fwd", "bwd", "clip", "opt")  # speculators' _StepTimer.profile, in step order


def step_parts(lines: list[dict], warmup: int) -> dict[str, float]:
    """The median of each part of the steady steps, in ms: where a per-step gap between two runs
    lies. "queue" runs from the previous step's optimizer step to this step's batch: the
    previous step's metric logging (our stage's per-step events) and the wait for the loader."""
    profiles = [ln["profile"] for ln in lines if (ln.get("profile") or {}).get("step_ms")][warmup:]
    return {k: round(statistics.median(p[f"{k}_ms"] for p in profiles), 2) for k in STEP_PARTS if profiles and all(f"{k}_ms" in p for p in profiles)}


def wall_phases(lines: list[dict], started: float, ended: float) -> dict | None:
    """Where one run's wall time went, from the metric lines' times ("t", speculators_direct.py):
    start-up (process, imports, draft, loaders) until the first step began; the first step (its
    fetch: the loader's workers starting; forward and backward: the compilation); the other
    steps; the gaps between steps (at each epoch's end: the checkpoint, the validation and its
    workers and compilation); and what followed the last step or validation (clean-up, exit)."""
    steps = [ln for ln in lines if "train" in ln and (ln.get("profile") or {}).get("step_ms") and "t" in ln]
    if not steps:
        return None
    first = steps[0]["profile"]
    gaps = sum(max(0.0, b["t"] - a["t"] - b["profile"]["step_ms"] / 1000) for a, b in zip(steps, steps[1:]))
    last = max(ln["t"] for ln in lines if "t" in ln and ("train" in ln or "val" in ln))
    return {"steps": len(steps), "start_up_s": round(steps[0]["t"] - first["step_ms"] / 1000 - started, 1), "first_step_s": round(first["step_ms"] / 1000, 1),
            "first_step_parts_s": {k: round(first.get(f"{k}_ms", 0.0) / 1000, 1) for k in ("fetch", "fwd", "bwd", "opt")},
            "other_steps_s": round(sum(ln["profile"]["step_ms"] for ln in steps[1:]) / 1000, 1), "between_steps_s": round(gaps, 1),
            "after_last_step_s": round(last - steps[-1]["t"], 1), "exit_s": round(ended - last, 1), "validations": sum("val" in ln for ln in lines)}


def part_train(work: Path, args, rows, results, started: float) -> None:
    variants = [("ours", "train_observed.py", "all", {}), ("direct", "speculators_direct.py", None, {}),
                ("ours without per-step events (bridge)", "train_observed.py", "all", {"HARNESS_TRAIN_BENCH_WITHOUT": "bridge"}),
                ("ours with the replies' loss mask (speculators' own)", "train_observed.py", "replies", {}),
                ("ours without the rounds walk", "train_observed.py", "all", {"HARNESS_TRAIN_BENCH_WITHOUT": "walk"}),
                ("ours, again (order effects)", "train_observed.py", "all", {})]
    variants = [variants[int(i)] for i in args.train_pick.split(",")] if args.train_pick else variants[: args.train_variants]
    results["train"] = {}
    spec_argv = None
    per_run = None
    seen: dict[str, int] = {}
    sides: dict[str, str] = {}  # run -> "ours" (our stage as a user runs it), "ours, replies' mask" or "direct": what the ratios compare
    for i, (name, script, loss_on, env_extra) in enumerate(variants):
        seen[name] = seen.get(name, 0) + 1
        name = name if seen[name] == 1 else f"{name} (run {seen[name]})"  # --train-pick may repeat a variant
        if script == "speculators_direct.py" or not env_extra:
            # ours as a user runs it (the loss on every token), ours at direct's own loss mask (the same
            # work a step: what the stage itself costs), and direct
            sides[name] = "direct" if script == "speculators_direct.py" else {"all": "ours", "replies": "ours, replies' mask"}[loss_on]
        if script == "speculators_direct.py" and not cuda():
            results["train"][name] = "not run: speculators train needs an accelerator"
            continue
        if per_run is not None and time.monotonic() - started + per_run > args.budget_s:
            results["train"][name] = f"not run: budget ({per_run:.0f} s a run)"
            print(f"train {name}: {results['train'][name]}", flush=True)
            continue
        out = f"ckpt_{i}"
        if script == "speculators_direct.py":
            argv = [a.replace(str(work / "ckpt_0"), str(work / out)) for a in spec_argv]
        else:
            argv = train_argv(work, args, out, loss_on)
        shutil.rmtree(work / out, ignore_errors=True)
        t0, t0_wall = time.monotonic(), time.time()
        lines, log = run_observed(work, script, argv, out, env_extra)
        wall = time.monotonic() - t0
        # a run's checkpoints (3.6 GiB an epoch at Llama-3.1-8B width: a full-vocabulary lm_head and
        # the optimizer's moments) are not read: four runs of three epochs would fill the disk
        shutil.rmtree(work / out, ignore_errors=True)
        phases = wall_phases(lines, t0_wall, t0_wall + wall)
        per_run = wall if per_run is None else min(per_run, wall)
        if spec_argv is None and script == "train_observed.py":
            spec_argv = json.loads(next(ln.split("speculators argv: ", 1)[1] for ln in log.splitlines() if "speculators argv: " in ln))
        rate = gb.steady_tokens_per_s(step_rates(lines), args.warmup_steps)
        ms = [ln["profile"]["step_ms"] for ln in lines if (ln.get("profile") or {}).get("step_ms")][args.warmup_steps:]
        results["train"][name] = {"tokens_per_s": rate["median"], "steps": rate["steps"], "median_step_ms": statistics.median(ms) if ms else None, "wall_s": round(wall, 1),
                                  "step_parts_ms": step_parts(lines, args.warmup_steps), "wall_phases": phases}
        print(f"train {name}: {results['train'][name]}", flush=True)
        if phases:
            f = phases["first_step_parts_s"]
            print(f"train {name}: wall {wall:.1f} s = start-up {phases['start_up_s']} + first step {phases['first_step_s']} (fetch {f['fetch']}, forward {f['fwd']}, "
                  f"backward {f['bwd']}) + {phases['steps'] - 1} steps {phases['other_steps_s']} + between steps {phases['between_steps_s']} "
                  f"({phases['validations']} validations) + after the last step {phases['after_last_step_s']} + exit {phases['exit_s']}", flush=True)
    t = {n: v for n, v in results["train"].items() if isinstance(v, dict)}
    ours = t.get("ours")
    runs_of = {side: [v["tokens_per_s"] for n, v in t.items() if sides.get(n) == side and v["tokens_per_s"]] for side in ("ours", "ours, replies' mask", "direct")}
    direct_runs = runs_of["direct"]
    for side, key, what in (("ours", "train_ratio", "our stage (its default: the loss on every token)"),
                            ("ours, replies' mask", "train_ratio_same_mask", "our stage at speculators' own replies-only loss mask (the same work a step)")):
        ours_runs = runs_of[side]
        if not (ours_runs and direct_runs):
            continue
        mean_ours, mean_direct = statistics.mean(ours_runs), statistics.mean(direct_runs)
        results[key] = {"ours_runs": ours_runs, "direct_runs": direct_runs, "ratio": mean_ours / mean_direct,
                        "range": [min(ours_runs) / max(direct_runs), max(ours_runs) / min(direct_runs)]}
        runs = f" (runs {', '.join(f'{r:,.0f}' for r in ours_runs)} vs {', '.join(f'{r:,.0f}' for r in direct_runs)}; ratio range {results[key]['range'][0]:.3f}-{results[key]['range'][1]:.3f})"
        emit(rows, Row(f"training tokens/s, {what} vs `speculators train` direct (1 GPU, same data and flags, median of steady steps; mean of runs)" + runs,
                       f"{mean_ours:,.0f}", f"{mean_direct:,.0f}", mean_ours / mean_direct, ">= 1.0"))
    direct = next((v for n, v in t.items() if sides.get(n) == "direct"), None)
    if ours and direct and ours.get("step_parts_ms") and direct.get("step_parts_ms"):
        o, d = ours["step_parts_ms"], direct["step_parts_ms"]
        results["train_step_parts_gap_ms"] = {k: round(o[k] - d[k], 2) for k in o if k in d}
        print("train: median step parts, ours - direct (ms): " + ", ".join(f"{k} {o[k]:.1f} - {d[k]:.1f} = {o[k] - d[k]:+.1f}" for k in o if k in d), flush=True)
    for name, v in t.items():
        if name == "ours" or sides.get(name) == "direct" or not ours or not v.get("median_step_ms"):
            continue
        emit(rows, Row(f"train: {name}; per-step ms vs ours ({ours['median_step_ms']:.1f} ms): the extra costs the difference",
                       f"{v['median_step_ms']:.1f} ms", f"{ours['median_step_ms']:.1f} ms", ours["median_step_ms"] / v["median_step_ms"], "report"))


# ---------------------------------------------------------------------------------------------


def write(out: Path, args, results: dict, rows: list[Row]) -> str:
    results["rows"] = [r.__dict__ for r in rows]
    table = "\n".join(["| measurement | ours | alternative | ratio | target |", "|---|---|---|---|---|", *(r.line() for r in rows)])
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = f"\n### {stamp}: {results['gpu']}, torch {results['torch']}\n\nCommand: `bash bench/gpu/speed.sh {' '.join(sys.argv[1:])}`\n\n{table}\n"
    (out / "speed_results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "speed_section.md").write_text(section)
    return section


def main() -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: where a slow part is, on stderr
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="toy sizes, on a CPU: the mechanics end to end")
    p.add_argument("--parts", default=",".join(ORDER))
    p.add_argument("--work", default="/tmp/speed-bench")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/speed-bench-out")
    p.add_argument("--budget-s", type=float, default=480.0, help="skip a part (or a train variant) that would end past this")
    p.add_argument("--layers", type=int, default=16, help="verifier layers at Llama-3.1-8B width (32: the whole 8B)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--extract-tokens", type=int, default=2_097_152)
    p.add_argument("--extract-batch-size", type=int, default=8)
    p.add_argument("--extract-max-batch-tokens", type=int, default=32768)
    p.add_argument("--extract-skip-batches", type=int, default=2, help="batches before the steady window")
    p.add_argument("--extract-keep-files", action="store_true", help="keep the files (needs 32 KiB a token of disk)")
    p.add_argument("--evaluate-chain-prompts", type=int, default=4, help="prompts the chain method runs beside the fast one (its identity check)")
    p.add_argument("--evaluate-profile", action="store_true", help="also write torch.profiler's tables of evaluate on 8 prompts under --out")
    p.add_argument("--regen-prompts", type=int, default=512)
    p.add_argument("--regen-new-tokens", type=int, default=256)
    p.add_argument("--train-samples", type=int, default=37)
    p.add_argument("--train-steps", type=int, default=40)
    p.add_argument("--train-epochs", type=int, default=3)
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--train-variants", type=int, default=6, help="how many of: ours, direct, without bridge, replies' mask, without walk, ours again")
    p.add_argument("--train-pick", default="", help="which of those, by index, in order (0,1,5: ours, direct, ours again)")
    args = p.parse_args()
    if args.quick:
        args.layers, args.seq_len, args.extract_tokens, args.extract_batch_size = 8, 256, 256 * 24, 4
        args.regen_prompts, args.regen_new_tokens = 12, 16
        args.train_samples, args.train_steps, args.train_epochs, args.total_seq_len, args.warmup_steps = 8, 4, 1, 512, 1
        args.train_variants = min(args.train_variants, 3)  # ours, (direct: not on a CPU), without bridge
        args.extract_skip_batches = 1
    parts = args.parts.split(",")
    unknown = [x for x in parts if x not in ORDER]
    if unknown:
        p.error(f"unknown parts {unknown} (expected some of {','.join(ORDER)})")
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    rows: list[Row] = []
    results: dict = {"gpu": torch.cuda.get_device_name(0) if cuda() else "CPU (--quick: mechanics only)", "torch": torch.__version__, "parts_seconds": {}, "args": vars(args)}
    started = time.monotonic()
    args.deadline = started + args.budget_s
    for part in [x for x in ORDER if x in parts]:
        if time.monotonic() - started + ESTIMATE_S[part] > args.budget_s and not args.quick:
            results[f"skipped_{part}"] = f"not run: {time.monotonic() - started:.0f} s spent, estimate {ESTIMATE_S[part]} s, budget {args.budget_s:g} s"
            print(results[f"skipped_{part}"], flush=True)
            continue
        t0 = time.monotonic()
        try:
            if part == "train":
                part_train(work, args, rows, results, started)
            else:
                globals()[f"part_{part}"](work, args, rows, results)
        except (Exception, SystemExit) as e:  # one part's failure must not cost the others' figures
            if part == "setup":
                raise
            import traceback

            traceback.print_exc()
            results[f"failed_{part}"] = f"{type(e).__name__}: {e}"
            emit(rows, Row(part, "FAILED", f"{type(e).__name__}: {e}"[:200], None, ""))
        results["parts_seconds"][part] = round(time.monotonic() - t0, 1)
        print(f"{part}: {results['parts_seconds'][part]} s", flush=True)
        results["seconds"] = round(time.monotonic() - started, 1)
        write(out, args, results, rows)
    print(write(out, args, results, rows))


if __name__ == "__main__":
    main()
