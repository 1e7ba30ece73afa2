#!/usr/bin/env python3
"""The GPU proof (issue 6), one script for all of a step's measurements, run on the GPU machine:

    bash bench/gpu/run.sh            # installs the carried wheels, then runs this with --parts all

Parts (each prints a line, all land in one table, appended to bench/RESULTS.md and $OUT):
  setup    a Llama-3.1-8B-shaped verifier with random weights (hidden 4096, intermediate 14336,
           32/8 heads, vocab 128256, --layers layers) and >= 150k tokens of prepared data at
           sequence length ~4096, in speculators' formats (no hub, no tokenizer needed)
  extract  the `extract` stage (transformers backend) through the harness's job path
           (harness.jobs.Jobs on the local transport: supervisor, spec, events), against the
           forward-only throughput of the same model on the same batches in the same call
  train    the `train` stage (simple_flex_attention, compiled) through the harness on 1 GPU,
           against `speculators train` run directly on the same data with the same flags
  ddp      the `train` stage on all visible GPUs (torchrun, DDP) against the 1-GPU run
  nodes    the same launch path as two nodes of one GPU each on this machine (harness.multinode)

Throughput of training is speculators' own per-step profile (tokens_per_s, synchronised step
time) averaged over the steady state (steps after the first --warmup-steps), for both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "remote_scripts"))


@dataclass
class Row:
    what: str
    ours: str
    reference: str
    ratio: float | None
    target: str

    def line(self) -> str:
        r = f"{self.ratio:.2f}" if self.ratio is not None else "n/a"
        return f"| {self.what} | {self.ours} | {self.reference} | {r} | {self.target} |"


# ---------------------------------------------------------------------------------------------
# setup


# Llama-3.1-8B's shape; --tiny shrinks it to check this script's mechanics on a CPU.
FULL_SHAPE = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
TINY_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128256}


def device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def make_verifier(path: Path, layers: int, shape: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return
    config = LlamaConfig(
        **shape,
        num_hidden_layers=layers,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=128000,
        eos_token_id=128001,
    )
    config._attn_implementation = "sdpa"  # the verifier runs plain causal attention
    torch.manual_seed(0)
    with torch.device(device()):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_prepared(path: Path, samples: int, seq_len: int) -> int:
    """Random token rows (the draft learns nothing useful from them, which does not matter for
    throughput), loss on the second half of each row like an assistant reply."""
    import torch
    from datasets import Dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    if (path / "token_freq.pt").exists():
        return samples * seq_len
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128000, (samples, seq_len), generator=g)
    mask = torch.zeros_like(ids)
    mask[:, seq_len // 2 :] = 1
    ds = Dataset.from_dict({"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": [seq_len] * samples})
    ds.set_format(type="torch")
    ds.save_to_disk(str(path))
    save_token_frequency_distribution(dataset=ds, output_path=path / "token_freq.pt")
    return samples * seq_len


# ---------------------------------------------------------------------------------------------
# harness job path on the local transport


def run_stage(work: Path, stage: str, stage_args: dict, env: dict[str, str], timeout: float) -> dict:
    """One stage as a harness run (supervisor, spec, events) on the local transport; returns
    the stage's `finished` event."""
    from harness.config import Config, HostConfig, PipelineConfig
    from harness.jobs import Jobs
    from harness.transport.local import LocalTransport

    os.environ.update(env)
    for k in [k for k in ("CUDA_VISIBLE_DEVICES",) if k not in env]:
        os.environ.pop(k, None)
    from harness.config import SyncConfig
    from harness.sync import sync

    workdir = work / "harness-workdir"
    host = HostConfig(name="gpu", local=True, workdir=str(workdir), runtime="host", python=sys.executable)
    pipeline = PipelineConfig(verifier=str(work / "verifier"), data="", output_dir=str(work), stages={stage: stage_args})
    config = Config(path=REPO / "harness.toml", hosts={"gpu": host}, sync=SyncConfig(paths=["remote_scripts"]), pipeline=pipeline)
    transport = LocalTransport("gpu")
    sync(transport, config.root, config.sync.paths, str(workdir), python=sys.executable)
    jobs = Jobs(config, host, transport)
    run_id = jobs.start([stage])
    status = jobs.wait(run_id, timeout=timeout, poll_s=2.0)
    stage_dir = workdir / "runs" / run_id / stage
    events = [json.loads(line) for line in (stage_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    log = (stage_dir / "log").read_text(errors="replace")
    if status.state != "ok":
        print(log[-6000:])
        raise SystemExit(f"{stage} run {run_id} ended {status.state}")
    finished = next(e for e in reversed(events) if e.get("event") == "finished")
    finished["_events"] = events
    finished["_log"] = log
    return finished


def steady_tokens_per_s(metric_events: list[dict], warmup: int) -> tuple[float, int]:
    values = [e["metrics"]["tokens_per_s"] for e in metric_events if "tokens_per_s" in e.get("metrics", {})]
    steady = values[warmup:] or values
    return (statistics.mean(steady) if steady else 0.0), len(steady)


# ---------------------------------------------------------------------------------------------
# parts


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def part_extract(work: Path, args, rows: list[Row]) -> None:
    import torch

    from common.verifier import default_target_layers, load_verifier, locate_decoder
    from datasets import load_from_disk
    from extract_hidden_states import HiddenStateCapture, plan_batches

    # forward-only: the same model, capture hooks and batches, no device->host copy, no writes
    ds = load_from_disk(str(work / "prepared"))
    ds.set_format(type="torch")
    dev = device()
    model = load_verifier(str(work / "verifier"), device=dev, dtype="auto")
    parts = locate_decoder(model)
    capture = HiddenStateCapture(parts, default_target_layers(parts.num_layers))
    lengths = {i: int(ds[i]["seq_len"]) for i in range(len(ds))}
    batches = plan_batches(lengths, args.extract_batch_size, args.extract_max_batch_tokens)
    with torch.inference_mode():
        for b in batches[:2]:  # warm-up
            ids = torch.stack([ds[i]["input_ids"] for i in b]).to(dev)
            capture.run(ids, torch.ones_like(ids))
        sync()
        t0 = time.perf_counter()
        tokens = 0
        for b in batches:
            ids = torch.stack([ds[i]["input_ids"] for i in b]).to(dev)
            capture.run(ids, torch.ones_like(ids)).to(torch.bfloat16)
            tokens += ids.numel()
        sync()
        forward_tps = tokens / (time.perf_counter() - t0)
    capture.close()
    del model, capture
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    stage_args = {"batch_size": args.extract_batch_size, "max_batch_tokens": args.extract_max_batch_tokens, "output": str(work / "hidden_states"), "prepared": str(work / "prepared")}
    fin = run_stage(work, "extract", stage_args, {"CUDA_VISIBLE_DEVICES": "0"}, timeout=900)
    e2e_tps = float(fin.get("tokens_per_s") or fin.get("summary", {}).get("tokens_per_s") or 0.0)
    ratio = e2e_tps / forward_tps if forward_tps else None
    rows.append(Row("extraction tokens/s (end-to-end vs forward-only, 1 GPU)", f"{e2e_tps:,.0f}", f"{forward_tps:,.0f}", ratio, ">= 0.8"))
    print(rows[-1].line(), flush=True)


def train_args(work: Path, args, out: str, nproc: int) -> dict:
    return {
        "prepared": str(work / "prepared"),
        "hidden_states": str(work / "hidden_states"),
        "output": str(work / out),
        "epochs": args.train_epochs,
        "total_seq_len": args.total_seq_len,
        "attn_impl": "simple_flex_attention",
        "mask_token_id": 128002,
        "no_resume": True,
        "nproc": nproc,
        "log_freq": 1,
    }


def part_train(work: Path, args, rows: list[Row], results: dict) -> None:
    fin = run_stage(work, "train", train_args(work, args, "ckpt_ours", 1), {"CUDA_VISIBLE_DEVICES": "0"}, timeout=1200)
    metrics = [e for e in fin["_events"] if e.get("event") == "metric"]
    ours_tps, n = steady_tokens_per_s(metrics, args.warmup_steps)
    ours_mem = fin.get("peak_memory_gb")
    results["train_1gpu"] = {"tokens_per_s": ours_tps, "steady_steps": n, "peak_memory_gb": ours_mem, "seconds": fin.get("seconds")}

    # speculators train, directly, same flags (the argv our stage passed to it, from its log)
    spec_argv = json.loads(next(line.split("speculators argv: ", 1)[1] for line in fin["_log"].splitlines() if "speculators argv: " in line))
    spec_argv = [a if a != str(work / "ckpt_ours") else str(work / "ckpt_direct") for a in spec_argv]
    spec_argv = [a if a != str(work / "ckpt_ours" / "logs") else str(work / "ckpt_direct" / "logs") for a in spec_argv]
    metrics_file = work / "direct_metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "BENCH_METRICS": str(metrics_file)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("speculators_direct.py")), *spec_argv], env=env, cwd=str(work), timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"speculators train (direct) failed with exit code {proc.returncode}")
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    direct = [{"metrics": {"tokens_per_s": ln["profile"]["tokens_per_s"]}} for ln in lines if "profile" in ln]
    direct_tps, _ = steady_tokens_per_s(direct, args.warmup_steps)
    direct_mem = next((ln["peak_memory_gb"] for ln in lines if "peak_memory_gb" in ln), None)
    results["train_direct"] = {"tokens_per_s": direct_tps, "peak_memory_gb": direct_mem, "seconds": round(time.monotonic() - t0, 1)}
    rows.append(Row("training tokens/s (our train stage vs speculators train, 1 GPU)", f"{ours_tps:,.0f}", f"{direct_tps:,.0f}", ours_tps / direct_tps if direct_tps else None, ">= 0.97"))
    print(rows[-1].line(), flush=True)
    rows.append(Row("training peak memory GB (ours vs direct)", f"{ours_mem}", f"{direct_mem}", (ours_mem / direct_mem) if ours_mem and direct_mem else None, "about 1"))
    print(rows[-1].line(), flush=True)


def part_ddp(work: Path, args, rows: list[Row], results: dict) -> None:
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        rows.append(Row("training tokens/s, DDP on 2 GPUs vs 1 GPU", "not run", "one GPU here", None, ">= 1.8"))
        print(rows[-1].line(), flush=True)
        return
    fin = run_stage(work, "train", train_args(work, args, "ckpt_ddp", 2), {}, timeout=1200)
    metrics = [e for e in fin["_events"] if e.get("event") == "metric"]
    # speculators' per-rank profile counts the rank's own tokens; the metric bridge reports rank 0
    per_rank, _ = steady_tokens_per_s(metrics, args.warmup_steps)
    total = per_rank * 2
    one = results.get("train_1gpu", {}).get("tokens_per_s")
    results["train_2gpu"] = {"tokens_per_s_total": total, "tokens_per_s_rank0": per_rank, "seconds": fin.get("seconds")}
    rows.append(Row("training tokens/s, DDP on 2 GPUs vs 1 GPU (torchrun via harness)", f"{total:,.0f}", f"{one:,.0f}" if one else "n/a", total / one if one else None, ">= 1.8"))
    print(rows[-1].line(), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/gpu-bench")
    p.add_argument("--parts", default="all")
    p.add_argument("--layers", type=int, default=8, help="verifier layers (>= 7 for speculators' default target layers)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--extract-batch-size", type=int, default=8)
    p.add_argument("--extract-max-batch-tokens", type=int, default=32768)
    p.add_argument("--train-epochs", type=int, default=3)
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-bench-out"))
    p.add_argument("--tiny", action="store_true", help="a small verifier and few samples: checks the mechanics on a CPU")
    args = p.parse_args()
    parts = {"setup", "extract", "train", "ddp"} if args.parts == "all" else set(args.parts.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "CPU (mechanics check only)"
    rows: list[Row] = []
    results: dict = {"gpu": gpu, "torch": torch.__version__}
    t0 = time.monotonic()
    if "setup" in parts:
        make_verifier(work / "verifier", args.layers, TINY_SHAPE if args.tiny else FULL_SHAPE)
        results["tokens"] = make_prepared(work / "prepared", args.samples, args.seq_len)
        print(f"setup: {results['tokens']} tokens, verifier {args.layers} layers, {time.monotonic() - t0:.0f} s", flush=True)
    if "extract" in parts:
        part_extract(work, args, rows)
    if "train" in parts:
        part_train(work, args, rows, results)
    if "ddp" in parts:
        part_ddp(work, args, rows, results)
    results["rows"] = [r.__dict__ for r in rows]
    results["seconds"] = round(time.monotonic() - t0, 1)
    table = "\n".join(["| measurement | ours | reference | ratio | target |", "|---|---|---|---|---|", *(r.line() for r in rows)])
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    section = f"\n## GPU proof ({stamp}, {gpu}, torch {torch.__version__})\n\nCommand: `bash bench/gpu/run.sh` (bench/gpu/gpu_bench.py). Verifier: Llama-3.1-8B shape, {args.layers} layers, random weights; {results.get('tokens', '?')} tokens at seq_len {args.seq_len}.\n\n{table}\n"
    (out / "gpu_results.json").write_text(json.dumps(results, indent=2))
    (out / "gpu_section.md").write_text(section)
    print(section)


if __name__ == "__main__":
    main()
