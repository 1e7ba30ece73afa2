#!/usr/bin/env python3
"""The GPU proof (issues 6 and 7), one script for all of a step's measurements, run on the GPU machine:

    bash bench/gpu/run.sh            # installs the carried wheels, then runs this with --parts all

All parts take ~17 minutes on 2 x H200, more than one device call's 10. The calls that produced
bench/RESULTS.md (newest first; `ddp` before `fsdp` gives the FSDP row its ratio):
    bash bench/gpu/run.sh --parts setup,extract,train,ddp --no-extract-shm --extract-tail-rows "" --samples 37
    bash bench/gpu/run.sh --parts setup,extract,ddp,fsdp --no-extract-shm --samples 37
    bash bench/gpu/run.sh --parts setup,extract,nodes,fsdp --extract-writer-threads 2,8 --no-extract-shm --samples 37
The extract part measures the stage's defaults and, beside them, each of --extract-writer-threads
and --extract-tail-rows (default "0": the last batch whole, as before `--tail-rows`).

Parts (each prints its rows at once; results.json and the table are rewritten after every part,
so a run stopped by its time limit still returns what it measured):
  setup    a Llama-3.1-8B-shaped verifier with random weights (hidden 4096, intermediate 14336,
           32/8 heads, vocab 128256, --layers layers) and >= 150k tokens of prepared data at
           sequence length ~4096, in speculators' formats (no hub, no tokenizer needed)
  extract  the `extract` stage (transformers backend) through the harness's job path
           (harness.jobs.Jobs on the local transport: supervisor, spec, events), against the
           forward-only throughput of the same model on the same batches in the same call; every
           file is compared with the forward-only states; then the same stage writing to
           /dev/shm (where it has room), which separates the disk from the pipeline
  train    the `train` stage (simple_flex_attention, compiled) through the harness on 1 GPU,
           against `speculators train` run directly on the same data with the same flags
  ddp      the `train` stage on both GPUs (torchrun, DDP) against the 1-GPU run
  nodes    the same train stage as a group run of two nodes of one GPU each on this machine
           (harness.multinode.GroupRun: node_launcher, torchrun's rendezvous, NCCL) against `ddp`
  fsdp     the `train` stage on both GPUs with --fsdp (speculators' FSDP2): that it works, and
           its tokens/s against DDP

Training throughput is speculators' own per-step profile (tokens_per_s over a synchronised step
time, per rank) for both sides: the median over the steady state (the steps after the first
--warmup-steps, which hold compilation), summed over ranks for multi-GPU runs.
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


def local_host(name: str, workdir: Path, gpus: list[int]):
    from harness.config import HostConfig

    return HostConfig(name=name, local=True, workdir=str(workdir), runtime="host", python=sys.executable, gpus=gpus)


def bench_config(work: Path, hosts: dict, stage: str, stage_args: dict, groups: dict | None = None):
    from harness.config import Config, PipelineConfig, SyncConfig

    pipeline = PipelineConfig(verifier=str(work / "verifier"), data="", output_dir=str(work), stages={stage: stage_args})
    return Config(path=REPO / "harness.toml", hosts=hosts, groups=groups or {}, sync=SyncConfig(paths=["remote_scripts"]), pipeline=pipeline)


def stage_outcome(workdir: Path, run_id: str, stage: str, state: str) -> dict:
    """The stage's `finished` event, with all its events and its log attached."""
    stage_dir = workdir / "runs" / run_id / stage
    if state != "ok":
        for name in (stage_dir / "log", workdir / "runs" / run_id / "supervisor.log"):
            print(f"--- {name}\n" + (name.read_text(errors="replace")[-6000:] if name.exists() else "(none)"))
        raise SystemExit(f"{stage} run {run_id} ended {state}")
    events = [json.loads(line) for line in (stage_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    log = (stage_dir / "log").read_text(errors="replace")
    finished = next(e for e in reversed(events) if e.get("event") == "finished")
    finished["_events"] = events
    finished["_log"] = log
    return finished


def run_stage(work: Path, stage: str, stage_args: dict, gpus: list[int], timeout: float) -> dict:
    """One stage as a harness run (supervisor, spec, events) on the local transport, on `gpus`
    (the host's `gpus`: its CUDA_VISIBLE_DEVICES); returns the stage's `finished` event."""
    from harness.host import Host
    from harness.sync import sync
    from harness.transport.local import LocalTransport

    workdir = work / "harness-workdir"
    config = bench_config(work, {"gpu": local_host("gpu", workdir, gpus)}, stage, stage_args)
    transport = LocalTransport("gpu")
    sync(transport, config.root, config.sync.paths, str(workdir), python=sys.executable)
    jobs = Host(config, config.host("gpu"), lambda _name: transport).jobs
    run_id = jobs.launch([stage], fresh=["all"]).run_id  # a bench measures work done, never a reused artifact
    status = jobs.wait(run_id, timeout=timeout, poll_s=2.0)
    return stage_outcome(workdir, run_id, stage, status.state)


def run_group_stage(work: Path, stage: str, stage_args: dict, timeout: float) -> dict:
    """The stage as one group run over two `local` hosts of one GPU each (node 0: GPU 0, node 1:
    GPU 1): the multi-node launch path, with the rendezvous on 127.0.0.1. Node 0's outcome."""
    from harness.config import GroupConfig
    from harness.fanout import open_all
    from harness.group import Group
    from harness.sync import sync_hosts
    from harness.transport.local import LocalTransport

    workdirs = {f"node{i}": work / f"node{i}-workdir" for i in range(2)}
    hosts = {name: local_host(name, wd, [i]) for i, (name, wd) in enumerate(workdirs.items())}
    group = GroupConfig(name="pair", hosts=list(hosts), rdzv_port=0, nproc_per_node=1, watchdog_timeout=120.0)
    config = bench_config(work, hosts, stage, stage_args, {"pair": group})
    transports = open_all(LocalTransport, list(hosts))
    for host, _, error in sync_hosts(config, transports, config.sync.paths):
        if error is not None:
            raise SystemExit(f"sync to {host} failed: {error}")
    runner = Group(config, "pair", lambda h: transports[h]).jobs
    launch = runner.launch([stage], fresh=["all"])
    status = runner.watch(launch.run_id, timeout=timeout)
    if status.state != "ok":
        for node in status.nodes:
            print(f"{node.host}: {node.state} {node.failure() or ''}")
    return stage_outcome(workdirs["node0"], launch.run_id, stage, status.state)


def steady_tokens_per_s(per_step: list[float], warmup: int) -> dict:
    """Median and mean tokens/s over the steps after `warmup` (compilation lives in those)."""
    steady = per_step[warmup:] or per_step
    if not steady:
        return {"median": 0.0, "mean": 0.0, "steps": 0}
    return {"median": statistics.median(steady), "mean": statistics.mean(steady), "steps": len(steady)}


def stage_step_rates(finished: dict) -> list[float]:
    return [e["metrics"]["tokens_per_s"] for e in finished["_events"] if e.get("event") == "metric" and "tokens_per_s" in e.get("metrics", {})]


# ---------------------------------------------------------------------------------------------
# parts


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


EDGE = 8  # positions kept per sample at each end, to compare the stage's files with forward-only


def forward_only(work: Path, args) -> tuple[float, dict[int, tuple]]:
    """Tokens/s of the verifier's capture forward on the stage's batches (no device->host copy, no
    files), and each sample's first and last EDGE positions for the file check. The last batch
    stays whole (tail_rows 0) here: the reference is the forward at its fastest, so the stage's
    single-row tail batches count against it."""
    import torch
    from datasets import load_from_disk

    from common.verifier import default_target_layers, load_verifier, locate_decoder
    from common.sharding import plan_batches
    from common.hidden_state_capture import HiddenStateCapture

    ds = load_from_disk(str(work / "prepared"))
    ds.set_format(type="torch")
    dev = device()
    model = load_verifier(str(work / "verifier"), device=dev, dtype="auto")
    parts = locate_decoder(model)
    capture = HiddenStateCapture(parts, default_target_layers(parts.num_layers))
    lengths = {i: int(ds[i]["seq_len"]) for i in range(len(ds))}
    batches = plan_batches(lengths, args.extract_batch_size, args.extract_max_batch_tokens)
    edges: dict[int, tuple] = {}
    with torch.inference_mode():
        for b in batches[:2]:  # warm-up
            ids = torch.stack([ds[i]["input_ids"] for i in b]).to(dev)
            capture.run(ids, torch.ones_like(ids))
        cuda_sync()
        t0 = time.perf_counter()
        tokens = 0
        for b in batches:
            ids = torch.stack([ds[i]["input_ids"] for i in b]).to(dev)
            states = capture.run(ids, torch.ones_like(ids)).to(torch.bfloat16)
            tokens += ids.numel()
            for row, i in enumerate(b):  # small slices, kept on the device until the clock stops
                edges[i] = (states[row, :EDGE].clone(), states[row, -EDGE:].clone())
        cuda_sync()
        forward_tps = tokens / (time.perf_counter() - t0)
    edges = {i: (a.cpu(), z.cpu()) for i, (a, z) in edges.items()}
    capture.close()
    del model, capture
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return forward_tps, edges


def compare_files(output: Path, edges: dict[int, tuple]) -> dict:
    """Each hs_<i>.safetensors' first and last positions against forward-only: a pinned buffer
    reused too early, or a row written from the wrong slot, shows here."""
    from safetensors import safe_open

    exact, worst = 0, 0.0
    for i, (first, last) in edges.items():
        with safe_open(str(output / f"hs_{i}.safetensors"), framework="pt") as f:
            hs = f.get_tensor("hidden_states")
        got = (hs[:EDGE].float(), hs[-EDGE:].float())
        want = (first.float(), last.float())
        exact += all(g.shape == w.shape and bool((g == w).all()) for g, w in zip(got, want))
        worst = max([worst] + [float(((g - w).abs().max() / w.abs().max().clamp_min(1e-6))) for g, w in zip(got, want) if g.shape == w.shape])
    return {"files": len(edges), "exact": exact, "max_rel_diff": worst}


def pinned_alloc_seconds(nbytes: int) -> float | None:
    """What one fresh pinned host buffer of a batch's size costs (what the stage paid per batch
    before its buffers were pinned once and reused)."""
    import torch

    if not torch.cuda.is_available():
        return None
    t0 = time.perf_counter()
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    seconds = time.perf_counter() - t0
    del buf
    return seconds


def part_extract(work: Path, args, rows: list[Row], results: dict) -> None:
    import shutil

    forward_tps, edges = forward_only(work, args)
    stage_args = {"batch_size": args.extract_batch_size, "max_batch_tokens": args.extract_max_batch_tokens, "prepared": str(work / "prepared")}
    # The last run writes the hidden states the train parts read: the stage's defaults.
    disk = work / "hidden_states"
    runs = [("disk", disk, {"writer_threads": int(t)}) for t in args.extract_writer_threads.split(",") if t]
    runs += [("disk", disk, {"tail_rows": int(t)}) for t in args.extract_tail_rows.split(",") if t]
    runs.append(("disk", disk, {}))
    if args.extract_shm:
        needed = 2 * results.get("tokens", 0) * 4 * FULL_SHAPE["hidden_size"] * 2
        shm = Path("/dev/shm")
        if shm.is_dir() and shutil.disk_usage(shm).free > needed:
            runs.insert(0, ("/dev/shm", shm / "gpu-bench-hidden-states", {}))
        else:
            results["extract_shm"] = f"not run: /dev/shm has {shutil.disk_usage(shm).free / 2**30:.1f} GiB free, needs {needed / 2**30:.1f}" if shm.is_dir() else "not run: no /dev/shm"
    results["extract"] = []
    for where, output, overrides in runs:
        shutil.rmtree(output, ignore_errors=True)
        fin = run_stage(work, "extract", {**stage_args, "output": str(output), **overrides}, [0], timeout=900)
        e2e = float(fin.get("tokens_per_s") or 0.0)
        check = compare_files(output, edges)
        setup_msg = next((e["text"] for e in fin["_events"] if e.get("event") == "message" and "pinned" in e.get("text", "")), "")
        keys = ("stage_seconds", "loop_seconds", "waited_for_writer_s", "final_drain_s", "writer_threads")
        results["extract"].append({"where": where, "overrides": overrides, "tokens_per_s": e2e, "forward_only_tokens_per_s": forward_tps, "files_vs_forward_only": check, "setup": setup_msg,
                                   **{k: fin.get("seconds" if k == "stage_seconds" else k) for k in keys}})
        tail = f"tail_rows {overrides['tail_rows']}" if "tail_rows" in overrides else "default tail_rows"
        rows.append(Row(f"extraction tokens/s, `extract` stage writing to {where} with {fin.get('writer_threads')} writer threads, {tail}, vs forward-only "
                        f"(1 GPU; blocked on writes {fin.get('waited_for_writer_s')} s, final drain {fin.get('final_drain_s')} s of {fin.get('loop_seconds')} s; "
                        f"files equal forward-only: {check['exact']}/{check['files']})",
                        f"{e2e:,.0f}", f"{forward_tps:,.0f}", e2e / forward_tps if forward_tps else None, ">= 0.8"))
        print(rows[-1].line(), flush=True)
        if where != "disk":
            shutil.rmtree(output, ignore_errors=True)
    slot = args.extract_max_batch_tokens * 4 * (TINY_SHAPE if args.tiny else FULL_SHAPE)["hidden_size"] * 2
    results["fresh_pinned_buffer_seconds"] = pinned_alloc_seconds(slot)


def train_args(work: Path, args, out: str, **extra) -> dict:
    return {
        "prepared": str(work / "prepared"),
        "hidden_states": str(work / "hidden_states"),
        "output": str(work / out),
        "epochs": args.train_epochs,
        "total_seq_len": args.total_seq_len,
        "attn_impl": "simple_flex_attention" if gpu_count() else "sdpa",  # flex cannot train on CPU (--tiny)
        "mask_token_id": 128002,
        "no_resume": True,
        "log_freq": 1,
        **extra,
    }


def train_record(fin: dict, warmup: int, ranks: int) -> dict:
    rate = steady_tokens_per_s(stage_step_rates(fin), warmup)
    return {"tokens_per_s": rate["median"] * ranks, "rank0": rate, "ranks": ranks, "peak_memory_gb_rank0": fin.get("peak_memory_gb"),
            "stage_seconds": fin.get("seconds"), "steps": fin.get("steps"), "val_loss": fin.get("val_loss")}


def part_train(work: Path, args, rows: list[Row], results: dict) -> None:
    fin = run_stage(work, "train", train_args(work, args, "ckpt_ours", processes=1), [0], timeout=1200)
    ours = results["train_1gpu"] = train_record(fin, args.warmup_steps, 1)

    if not gpu_count():  # --tiny on a CPU: speculators' own trainer asks for an accelerator
        results["train_direct"] = "not run: speculators train needs an accelerator"
        return
    # speculators train, directly, same flags (the argv our stage passed to it, from its log)
    spec_argv = json.loads(next(line.split("speculators argv: ", 1)[1] for line in fin["_log"].splitlines() if "speculators argv: " in line))
    spec_argv = [a.replace(str(work / "ckpt_ours"), str(work / "ckpt_direct")) for a in spec_argv]
    metrics_file = work / "direct_metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "BENCH_METRICS": str(metrics_file)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("speculators_direct.py")), *spec_argv], env=env, cwd=str(work), timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"speculators train (direct) failed with exit code {proc.returncode}")
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    direct_rate = steady_tokens_per_s([ln["profile"]["tokens_per_s"] for ln in lines if (ln.get("profile") or {}).get("tokens_per_s")], args.warmup_steps)
    direct_mem = next((ln["peak_memory_gb"] for ln in lines if "peak_memory_gb" in ln), None)
    direct = results["train_direct"] = {"tokens_per_s": direct_rate["median"], "rank0": direct_rate, "peak_memory_gb": direct_mem, "seconds": round(time.monotonic() - t0, 1)}
    rows.append(Row("training tokens/s, our `train` stage through harness.jobs vs `speculators train` direct (1 GPU, median of steady steps)",
                    f"{ours['tokens_per_s']:,.0f}", f"{direct['tokens_per_s']:,.0f}", ours["tokens_per_s"] / direct["tokens_per_s"] if direct["tokens_per_s"] else None, ">= 0.97"))
    print(rows[-1].line(), flush=True)
    mem = ours["peak_memory_gb_rank0"]
    rows.append(Row("training peak GPU memory GiB (ours vs direct)", f"{mem}", f"{direct_mem}", (mem / direct_mem) if mem and direct_mem else None, "about 1"))
    print(rows[-1].line(), flush=True)


def part_multi(work: Path, args, rows: list[Row], results: dict, part: str) -> None:
    """ddp, nodes, fsdp: two GPUs, three launch paths."""
    if gpu_count() < 2:
        results[part] = f"not run: {gpu_count()} GPU(s) here"
        rows.append(Row(f"training on 2 GPUs ({part})", "not run", f"{gpu_count()} GPU(s) here", None, ""))
        print(rows[-1].line(), flush=True)
        return
    if part == "ddp":
        fin = run_stage(work, "train", train_args(work, args, "ckpt_ddp", processes=2), [0, 1], timeout=1200)
        rec = results["train_ddp"] = train_record(fin, args.warmup_steps, 2)
        base = results.get("train_1gpu", {}).get("tokens_per_s")
        rows.append(Row("training tokens/s, DDP on 2 GPUs (torchrun via harness) vs 1 GPU", f"{rec['tokens_per_s']:,.0f}", f"{base:,.0f}" if base else "n/a", rec["tokens_per_s"] / base if base else None, ">= 1.8"))
    elif part == "nodes":
        fin = run_group_stage(work, "train", train_args(work, args, "ckpt_nodes"), timeout=1200)
        rec = results["train_nodes"] = train_record(fin, args.warmup_steps, 2)
        base = results.get("train_ddp", {}).get("tokens_per_s")
        rows.append(Row("training tokens/s, 2 nodes x 1 GPU (group run, NCCL) vs 1 node x 2 GPUs", f"{rec['tokens_per_s']:,.0f}", f"{base:,.0f}" if base else "n/a", rec["tokens_per_s"] / base if base else None, "report"))
    else:
        fin = run_stage(work, "train", train_args(work, args, "ckpt_fsdp", processes=2, fsdp=True, epochs=min(args.train_epochs, 2)), [0, 1], timeout=1200)
        rec = results["train_fsdp"] = train_record(fin, args.warmup_steps, 2)
        base = results.get("train_ddp", {}).get("tokens_per_s")
        rows.append(Row("training tokens/s, FSDP on 2 GPUs (--fsdp) vs DDP on 2 GPUs", f"{rec['tokens_per_s']:,.0f}", f"{base:,.0f}" if base else "n/a", rec["tokens_per_s"] / base if base else None, "works"))
    print(rows[-1].line(), flush=True)


# Seconds per part on 2 x H200 (2026-11-30; the first compiled train pays ~100 s of compilation), to
# skip a part that cannot finish inside --budget-s rather than lose the whole table to the limit.
PART_ESTIMATE_S = {"setup": 30, "extract": 60, "train": 370, "ddp": 210, "nodes": 210, "fsdp": 260}
ORDER = ["setup", "extract", "train", "ddp", "nodes", "fsdp"]


def write_results(out: Path, args, results: dict, rows: list[Row]) -> str:
    import torch

    results["rows"] = [r.__dict__ for r in rows]
    table = "\n".join(["| measurement | ours | reference | ratio | target |", "|---|---|---|---|---|", *(r.line() for r in rows)])
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = (f"\n### {stamp}: {results['gpu']}, torch {torch.__version__}\n\nCommand: `bash bench/gpu/run.sh {' '.join(sys.argv[1:])}` (bench/gpu/gpu_bench.py). "
               f"Verifier: Llama-3.1-8B shape, {args.layers} layers, random weights; {results.get('tokens', '?')} tokens at seq_len {args.seq_len}.\n\n{table}\n")
    (out / "gpu_results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "gpu_section.md").write_text(section)
    return section


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/gpu-bench")
    p.add_argument("--parts", default="all", help=f"comma-separated, from {','.join(ORDER)}")
    p.add_argument("--layers", type=int, default=8, help="verifier layers (>= 7 for speculators' default target layers)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--extract-batch-size", type=int, default=8)
    p.add_argument("--extract-max-batch-tokens", type=int, default=32768)
    p.add_argument("--extract-writer-threads", default="", help="comma-separated writer-thread counts to measure besides the stage's default")
    p.add_argument("--extract-tail-rows", default="0", help="comma-separated --tail-rows values to measure besides the stage's default (0: the last batch whole)")
    p.add_argument("--extract-shm", action=argparse.BooleanOptionalAction, default=True, help="also measure the stage writing to /dev/shm")
    p.add_argument("--train-epochs", type=int, default=3)
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=560.0, help="skip a part whose estimate would end past this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-bench-out"))
    p.add_argument("--tiny", action="store_true", help="a small verifier and few samples: checks the mechanics on a CPU")
    args = p.parse_args()
    parts = ORDER if args.parts == "all" else args.parts.split(",")  # in the order given
    unknown = [x for x in parts if x not in ORDER]
    if unknown:
        p.error(f"unknown parts {unknown} (expected some of {','.join(ORDER)})")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # each run picks its GPUs through the host's `gpus`

    import torch

    gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "CPU (mechanics check only)"
    rows: list[Row] = []
    results: dict = {"gpu": gpu, "torch": torch.__version__, "parts_seconds": {}}
    t0 = time.monotonic()
    for part in parts:
        if time.monotonic() - t0 + PART_ESTIMATE_S[part] > args.budget_s:
            results[f"skipped_{part}"] = f"not run: {time.monotonic() - t0:.0f} s spent, estimate {PART_ESTIMATE_S[part]} s, budget {args.budget_s:g} s"
            print(results[f"skipped_{part}"], flush=True)
            continue
        started = time.monotonic()
        try:
            if part == "setup":
                make_verifier(work / "verifier", args.layers, TINY_SHAPE if args.tiny else FULL_SHAPE)
                results["tokens"] = make_prepared(work / "prepared", args.samples, args.seq_len)
            elif part == "extract":
                part_extract(work, args, rows, results)
            elif part == "train":
                part_train(work, args, rows, results)
            else:
                part_multi(work, args, rows, results, part)
        except (Exception, SystemExit) as e:  # one part's failure must not cost the others' figures
            if part in ("setup", "extract"):
                raise  # every later part needs their outputs
            results[f"failed_{part}"] = f"{type(e).__name__}: {e}"
            rows.append(Row(f"{part}", "FAILED", f"{type(e).__name__}: {e}"[:200], None, ""))
            print(rows[-1].line(), flush=True)
        results["parts_seconds"][part] = round(time.monotonic() - started, 1)
        print(f"{part}: {results['parts_seconds'][part]} s", flush=True)
        results["seconds"] = round(time.monotonic() - t0, 1)
        write_results(out, args, results, rows)
    print(write_results(out, args, results, rows))


if __name__ == "__main__":
    main()
