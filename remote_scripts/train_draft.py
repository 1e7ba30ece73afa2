"""Train the EAGLE-3 draft with speculators' own trainer, over the GPUs this host has.

    python remote_scripts/train_draft.py --verifier DIR --prepared DIR --hidden-states DIR \
        --output CHECKPOINTS [--speculative-tokens 3] [--epochs 20] [--lr 1e-3] [--events FILE]

speculators' trainer (speculators.train.cli.main) runs in-process, one process per visible GPU
through torchrun (this script re-executes itself), with what harness adds around it: explicit
choices where a default breaks on some platform (attention, loss, flex tiles, the mask token),
preflight guards before the first step, a recipe sized to the data, tau estimated while it trains
(best.json, the early stop), loggers, resume, events, and --online (the states from a vLLM server
instead of the extract stage). docs/architecture/gpu-side.md ("The GPU side") says what each does and why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# torch's OpenMP threads busy-wait by default: on a shared few-core box that makes every op crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.acceptance import EARLY_STOP_PATIENCE, ROUND_TAU, EarlyStop, estimate_tau, per_position_tau, still_learning_warning  # noqa: E402
from common.checkpoints import BEST_FILE, is_checkpoint, latest_checkpoint, read_best, write_best  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402
from common import loggers, verifier_path  # noqa: E402
from common.recipe import DataSize, size_recipe  # noqa: E402
from common.vllm_server import add_connector_argument, add_serve_arguments  # noqa: E402

STAGE = "train"
TAU_PROBE_BATCHES = 8  # validation batches per mid-epoch tau estimate (long epochs only)
ONLINE_CHILD_ENV = "HARNESS_TRAIN_ONLINE_LAUNCHED"  # set by the online launcher for its trainer: it wrote `started`
STAGING_DIR = "online_staging"
# For bench/gpu/speed.py only: extras of this stage to leave out ("bridge": no per-step events,
# "walk": no rounds walked in validation), to measure what each costs per step.
BENCH_WITHOUT_ENV = "HARNESS_TRAIN_BENCH_WITHOUT"
TORCHRUN_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


class TrainError(RuntimeError):
    """A problem with the inputs or the setup, reported as one line."""


# ---------------------------------------------------------------------------------------------
# Pure decisions (tested in tests/test_train.py)


def choose_loss_implementation(device_type: str, torch_version: str) -> str:
    """speculators' fused loss is a Triton kernel: there is no Triton on CPU, and on torch 2.11 it
    crashes under torch.compile (dynamo: 'ListVariable ... is already tracked for mutation')."""
    if device_type == "cpu":
        return "eager"
    major_minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    return "eager" if major_minor == "2.11" else "fused"


def choose_compute_dtype(device_type: str, cpu_bf16: bool) -> str:
    """speculators' autocast dtype (its --hidden-states-dtype; master weights stay fp32): bf16 where
    the hardware computes it, fp32 on a CPU without bf16 kernels, where autocast emulates it 30-45x
    slower than fp32 (bench/cpu_train_dtype.py)."""
    return "bfloat16" if device_type != "cpu" or cpu_bf16 else "float32"


def default_nproc(cuda_device_count: int) -> int:
    return max(1, cuda_device_count)


def default_num_workers(device_type: str, cpu_count: int, nproc: int) -> int:
    """Dataloader workers per rank. On CPU the workers would compete with training for the same
    cores (and each spawned worker re-imports torch): none."""
    if device_type == "cpu":
        return 0
    return max(1, min(8, cpu_count // max(1, nproc) - 1))


def check_hidden_state_layout(shape: tuple[int, ...], dtype: str, num_target_layers: int, hidden_size: int) -> None:
    """hs_<i>.safetensors 'hidden_states' must be [T, layers + 1, H] in bfloat16 (the +1 is the
    verifier's last, pre-norm layer: the training target)."""
    if len(shape) != 3 or shape[1] != num_target_layers + 1 or shape[2] != hidden_size:
        raise TrainError(
            f"hidden states have shape {list(shape)}, expected [T, {num_target_layers + 1}, {hidden_size}] "
            f"({num_target_layers} target layers + the last layer, verifier hidden size {hidden_size}): "
            "were they extracted with other --layers or another verifier?"
        )
    if dtype not in ("BF16", "bfloat16", "torch.bfloat16"):
        raise TrainError(f"hidden states are {dtype}, expected bfloat16 (re-extract, or train with matching --hidden-states-dtype)")


# ---------------------------------------------------------------------------------------------
# Launch


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description="Train an EAGLE-3 draft with speculators (torchrun over this host's GPUs).")
    p.add_argument("--verifier", required=True, help="verifier directory (or hub id)")
    p.add_argument("--prepared", required=True, help="prepared dataset (speculators format, with token_freq.pt)")
    p.add_argument("--hidden-states", default=None, help="directory of hs_<i>.safetensors (offline; not with --online)")
    p.add_argument("--output", required=True, help="checkpoint directory (one sub-directory per epoch)")
    p.add_argument("--speculative-tokens", type=int, default=3, help="TTT steps = tokens the draft proposes")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="verifier layer ids the hidden states were extracted from (default: the extraction's record, else [2, N//2, N-3])")
    p.add_argument("--epochs", type=int, default=None, help="default: 3, raised (up to 20) when the data is too small for enough optimizer steps (see common/recipe.py)")
    # 1e-3 (speculators' own default too): the highest held-out tau of the rates tried on the stdlib
    # bench (2.66 at k = 3; the others: docs/pipeline.md, "Training").
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW; linear decay after speculators' warm-up)")
    p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw")
    # Every position: the loss is a KL to the verifier's logits, a target on prompt tokens as much
    # as on replies, and a higher held-out tau than the replies alone at equal steps
    # (bench/quality/run.py --size cpu); validation keeps the replies' mask.
    p.add_argument("--loss-on", choices=["all", "replies"], default="all", help="training positions in the loss: every token's (default) or the replies' only (speculators' own); validation always uses the replies'")
    p.add_argument("--draft-vocab-size", type=int, default=None, help="prune the draft vocabulary to the N most frequent tokens (default: the verifier's full vocabulary)")
    p.add_argument("--num-layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--total-seq-len", type=int, default=None, help="tokens packed per batch per process (default: 512 on CPU, 8192 on GPU, halved while the data would give too few optimizer steps; see common/recipe.py)")
    p.add_argument("--attn-impl", choices=["auto", "simple_flex_attention", "sdpa", "eager"], default="auto", help="draft attention (auto: simple_flex_attention on GPU, sdpa on CPU)")
    p.add_argument("--loss-implementation", choices=["auto", "eager", "fused"], default="auto")
    p.add_argument("--hidden-states-dtype", default="auto", choices=["auto", "bfloat16", "float32"], help="the draft's compute dtype under autocast (auto: bfloat16, float32 on a CPU without bf16 kernels); the files stay bf16")
    p.add_argument("--mask-token-id", type=int, default=None, help="default: resolved from the verifier's tokenizer, never its processor (logged)")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the verifier's own config/tokenizer code (auto_map)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps (smoke runs)")
    p.add_argument("--early-stop-patience", type=int, default=EARLY_STOP_PATIENCE, help=f"stop after this many epoch validations in a row without a higher tau estimate (default {EARLY_STOP_PATIENCE}; 0: train every epoch; see common/acceptance.py)")
    p.add_argument("--tau-every", type=int, default=None, help="also estimate tau every N steps inside an epoch, on a few validation batches (default: only on epochs longer than 2000 steps, every 1000)")
    p.add_argument("--train-data-ratio", type=float, default=0.95, help="the rest of the prepared rows validate")
    p.add_argument("--num-workers", type=int, default=None, help="dataloader workers per rank (default: 0 on CPU)")
    p.add_argument("--log-freq", type=int, default=1, help="log metrics every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true", help="start over even if --output has checkpoints")
    p.add_argument("--fsdp", action="store_true", help="shard parameters, gradients and optimizer state over the processes (FSDP2) instead of replicating them (DDP, the default); needs 2 or more")
    p.add_argument("--processes", type=int, default=None, help="processes (GPUs) on this host (default: all visible GPUs; 1 on CPU); not --nproc: torchrun would take that for its own --nproc-per-node")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: 1 on a CPU-only host, where the draft is too small to gain from more; torch's default with GPUs)")
    p.add_argument("--speculators-arg", action="append", default=[], metavar="FLAG=VALUE", help="extra `speculators train` flag, e.g. --speculators-arg=--weight-decay=0.0 (repeatable)")
    p.add_argument("--loggers", nargs="+", choices=sorted(loggers.PACKAGES), default=[], help=f"speculators' metric loggers, writing under OUTPUT/{loggers.LOG_DIR} (see common/loggers.py)")
    p.add_argument("--run-name", default=None, help="the loggers' name for this run (default: speculators', the start time)")
    p.add_argument("--events", default=None, help="events.jsonl to append to")
    o = p.add_argument_group("online (no hidden states on disk: common/online.py)")
    o.add_argument("--online", action="store_true", help="start vllm serve with hidden-state extraction for the verifier and train from it (no extract stage)")
    o.add_argument("--vllm-endpoint", default=None, help="train from this running vLLM (http://HOST:PORT/v1, serving the verifier with extract_hidden_states and its connector writing into --staging-dir); --online sets it for its trainer")
    o.add_argument("--staging-dir", default=None, help=f"where vLLM's connector writes each row's states until the trainer has loaded them (default OUTPUT/{STAGING_DIR})")
    o.add_argument("--verifier-gpus", type=int, nargs="+", default=None, help="indices of the visible GPUs that serve the verifier (default: the first half; one GPU: shared)")
    o.add_argument("--train-gpus", type=int, nargs="+", default=None, help="indices of the visible GPUs that train the draft, torchrun over them (default: the rest)")
    o.add_argument("--server-log", default=None, help="vllm serve log (default OUTPUT/vllm_server.log)")
    add_serve_arguments(o, tcp=False)
    add_connector_argument(o)
    p.set_defaults(tensor_parallel_size=None)  # online: one tensor-parallel rank per verifier GPU unless given
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    return p.parse_args(argv)


def mode_problem(args: argparse.Namespace) -> str | None:
    """Offline needs --hidden-states; online takes none."""
    if not args.hidden_states and not (args.online or args.vllm_endpoint):
        return "--hidden-states is required (or train --online, from a vLLM it starts)"
    if args.hidden_states and (args.online or args.vllm_endpoint):
        return "--hidden-states is for offline training: --online asks vLLM for the states and keeps none"
    return None


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def relaunch_under_torchrun(nproc: int, argv: list[str]) -> int:
    """Run this script as `torchrun --standalone --nproc-per-node nproc`; returns its exit code."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", os.path.abspath(__file__), *argv]
    print(f"[{STAGE}] launching: {' '.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    problem = mode_problem(args)
    if problem:
        print(f"train_draft.py: error: {problem}", file=sys.stderr)
        return 2
    if args.online and not args.vllm_endpoint:
        return launch_online(args, argv)
    import torch

    cuda = torch.cuda.is_available()
    if args.threads or not cuda:
        torch.set_num_threads(args.threads or 1)
    nproc = args.processes or default_nproc(torch.cuda.device_count() if cuda else 0)
    if not under_torchrun() and cuda and nproc > 1:
        return relaunch_under_torchrun(nproc, argv)

    rank = int(os.environ.get("RANK", "0"))
    return run_stage(STAGE, args, lambda args, events: run(args, events, rank), rank=rank, echo=rank == 0,
                     announce=not os.environ.get(ONLINE_CHILD_ENV))  # the online launcher wrote `started`


# ---------------------------------------------------------------------------------------------
# The run


def run(args: argparse.Namespace, events: EventLog, rank: int) -> dict[str, Any]:
    import torch

    from common import draft_attention, speculators_compat

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu" and under_torchrun():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise TrainError("several training processes need GPUs: this host has none (run with --processes 1)")
        for name in TORCHRUN_ENV:  # a 1-process torchrun on CPU: speculators would ask for an accelerator
            os.environ.pop(name, None)

    if args.fsdp and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise TrainError("--fsdp shards over several processes: this run has one (use --processes 2 or more on a host with GPUs)")
    logger_messages = loggers.apply(args.loggers, str(Path(args.output).resolve() / loggers.LOG_DIR)) if args.loggers else []
    verifier = verifier_path.resolve(args.verifier)
    online = bool(args.vllm_endpoint)
    output = Path(args.output).resolve()
    prepared = Path(args.prepared).resolve()
    hs_dir = staging_dir(args) if online else Path(args.hidden_states).resolve()
    for what, path in (("--prepared", prepared), ("--staging-dir" if online else "--hidden-states", hs_dir)):
        if not path.is_dir():
            raise TrainError(f"{what} {path}: no such directory")
    from common.verifier import cpu_has_bf16, load_text_config

    verifier_cfg = load_text_config(verifier, args.trust_remote_code)
    layers = args.layers or (None if online else extraction_layers(hs_dir)) or None
    num_target_layers = len(layers) if layers else 3
    if not layers and verifier_cfg.num_hidden_layers < 7:
        raise TrainError(f"the verifier has {verifier_cfg.num_hidden_layers} layers: the default target layers [2, N//2, N-3] need at least 7; pass --layers")
    if not online:
        check_first_hidden_states(hs_dir, num_target_layers, verifier_cfg.hidden_size)

    attn_impl = draft_attention.default_attn_impl(device_type) if args.attn_impl == "auto" else args.attn_impl
    loss_impl = choose_loss_implementation(device_type, torch.__version__) if args.loss_implementation == "auto" else args.loss_implementation
    compute_dtype = choose_compute_dtype(device_type, cpu_has_bf16()) if args.hidden_states_dtype == "auto" else args.hidden_states_dtype
    if compute_dtype == "float32":  # speculators still enters autocast with it, which torch then disables
        warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype is not supported")
    num_workers = args.num_workers if args.num_workers is not None else default_num_workers(device_type, os.cpu_count() or 1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    shims = speculators_compat.apply_cpu_shims()
    if online:
        speculators_compat.reach_our_server()  # our vLLM's socket and key (train --online hands them down)
    kernel_options = None
    if device_type == "cuda" and attn_impl in draft_attention.FLEX_FAMILY:
        smem = draft_attention.device_shared_memory_per_block(int(os.environ.get("LOCAL_RANK", "0")))
        head_dim = getattr(verifier_cfg, "head_dim", None) or verifier_cfg.hidden_size // verifier_cfg.num_attention_heads
        kernel_options = draft_attention.flex_kernel_options(smem, head_dim) if smem else None
        speculators_compat.set_flex_kernel_options(kernel_options)
    mask_token_id, mask_token_source = resolve_mask_token_id(args.mask_token_id, verifier, verifier_cfg, args.trust_remote_code)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    recipe = size_recipe(
        prepared_data_size(prepared, args.train_data_ratio), world_size, device_type,
        tokens_per_step=args.total_seq_len, epochs=args.epochs, max_steps=args.max_steps,
    )

    spec_argv = [
        "--verifier-name-or-path", verifier,
        "--data-path", str(prepared),
        "--hidden-states-path", str(hs_dir),
        "--hidden-states-backend", "file",
        *(["--on-missing", "generate", "--vllm-endpoint", args.vllm_endpoint] if online else ["--on-missing", "raise"]),
        "--save-path", str(output),
        "--log-dir", str(output / loggers.LOG_DIR),
        "--ttt-steps", str(args.speculative_tokens),
        "--epochs", str(recipe.epochs),
        "--lr", str(args.lr),
        "--optimizer", args.optimizer,
        "--num-layers", str(args.num_layers),
        "--total-seq-len", str(recipe.tokens_per_step),
        "--draft-attn-impl", attn_impl,
        "--loss-implementation", loss_impl,
        "--hidden-states-dtype", compute_dtype,
        "--num-workers", str(num_workers),
        "--train-data-ratio", str(args.train_data_ratio),
        "--log-freq", str(args.log_freq),
        "--seed", str(args.seed),
    ]
    if layers:
        spec_argv += ["--target-layer-ids", *map(str, layers)]
    if args.draft_vocab_size:
        spec_argv += ["--draft-vocab-size", str(args.draft_vocab_size)]
    spec_argv += ["--mask-token-id", str(mask_token_id)]
    if args.trust_remote_code:
        spec_argv += ["--trust-remote-code"]
    if args.max_steps:
        spec_argv += ["--max-steps", str(args.max_steps)]
    if args.no_resume:
        spec_argv += ["--no-resume-from-checkpoint"]
    if args.fsdp:
        spec_argv += ["--fsdp-shard"]
    if args.loggers:
        spec_argv += ["--logger", ",".join(args.loggers)]
    if args.run_name:
        spec_argv += ["--run-name", args.run_name]
    for extra in args.speculators_arg:
        spec_argv += extra.split("=", 1) if extra.startswith("--") and "=" in extra else [extra]

    resumed_from = latest_epoch(output) if not args.no_resume else None
    if args.no_resume and rank == 0:
        for name in ("metrics.jsonl", BEST_FILE):  # the curves and the best checkpoint start over with the run
            (output / name).unlink(missing_ok=True)
    if rank == 0:
        events.message(
            f"device {device_type}, {world_size} process(es), {'FSDP' if args.fsdp else 'DDP'}, "
            f"attention {attn_impl}, loss {loss_impl}, compute {compute_dtype}, workers {num_workers}, "
            f"shims {shims or 'none'}, flex tiles {kernel_options or 'default'}, "
            f"mask token {mask_token_id} ({mask_token_source}), loss on {'every token' if args.loss_on == 'all' else 'the replies'}"
            + (f"; resuming after epoch {resumed_from}" if resumed_from is not None else "")
        )
        events.message(
            f"mode online: hidden states from vLLM at {speculators_compat.our_server_socket() or args.vllm_endpoint}, each row's file in {hs_dir} only until loaded"
            if online else f"mode offline: hidden states from {hs_dir}"
        )
        events.message(recipe.describe())
        for text in logger_messages:
            events.message(text)
        if recipe.warning:
            events.warning(recipe.warning)

    reporter = Reporter(events, rank, output, recipe.epochs)
    without = set(filter(None, os.environ.get(BENCH_WITHOUT_ENV, "").split(",")))
    bridge = None if "bridge" in without else speculators_compat.MetricsBridge(reporter.on_train, reporter.on_val)

    def before_training(model, trainer_config, train_loader, val_loader) -> None:
        guard_model(model, device_type, verifier)
        if args.loss_on == "all":
            speculators_compat.supervise_every_position(train_loader.dataset)
        if online:
            for loader in (train_loader, val_loader):
                speculators_compat.measure_generated_states(loader.dataset, str(hs_dir))
        reporter.steps_per_epoch = len(train_loader)
        reporter.started = time.monotonic()

    def estimate_tau_now(trainer) -> None:  # every rank, mid-epoch on long epochs
        metrics = speculators_compat.partial_validation(trainer, TAU_PROBE_BATCHES)
        reporter.on_tau_probe(trainer.global_step, metrics)

    early_stop = EarlyStop(args.early_stop_patience, args.speculative_tokens)
    if rank == 0 and resumed_from is not None:
        replay_validations(early_stop, output / "metrics.jsonl", resumed_from)

    def stop_after(epoch: int, metrics: dict) -> str | None:  # every rank, after the epoch's validation
        return rank0_verdict(early_stop_verdict(early_stop, epoch, recipe.epochs, metrics) if rank == 0 else None)

    if "walk" not in without:
        speculators_compat.walk_rounds_in_validation()  # the honest tau estimate (common/acceptance.py)
    tau_every = args.tau_every or recipe.tau_every
    speculators_compat.hook_main(before_training, bridge, every_steps=(tau_every, estimate_tau_now) if tau_every else None,
                                 stop_after=stop_after if args.early_stop_patience > 0 else None)

    from speculators.train.cli import main as speculators_main
    from speculators.train.config import TrainConfig

    try:
        cfg = TrainConfig.resolve(spec_argv)
    except SystemExit as e:
        raise TrainError(f"speculators rejected the configuration (exit {e.code}); its message is above") from None
    if rank == 0:
        # The exact flags handed to speculators, so anyone can re-run `speculators train` with them
        # (bench/gpu compares our stage against that direct run on the same data).
        print("speculators argv: " + json.dumps(spec_argv), flush=True)
    started, started_wall = time.monotonic(), time.time()
    exit_code = 1  # what W&B records for the run when speculators raises
    stopped: speculators_compat.StopTraining | None = None
    try:
        speculators_main(cfg)
        exit_code = 0
    except speculators_compat.StopTraining as stop:
        stopped, exit_code = stop, 0
        end_stopped_training()
    finally:
        if args.loggers and rank == 0:
            loggers.finish(str(output / loggers.LOG_DIR), exit_code)
    if bridge is not None:
        bridge.detach()
    # speculators catches SIGTERM/SIGINT, saves '<output>/interrupted' and returns normally.
    interrupted = output / "interrupted"
    if interrupted.is_dir() and interrupted.stat().st_mtime >= started_wall - 1:
        raise TrainError(f"interrupted by a signal: speculators saved its state to {interrupted}; a new run resumes from the last finished epoch")

    summary: dict[str, Any] = {"seconds": round(time.monotonic() - started, 1), "attn_implementation": attn_impl, "loss_implementation": loss_impl,
                               "mode": "online" if online else "offline"}
    if online and rank == 0:
        summary.update(online_disk(events, hs_dir, prepared, world_size, num_workers, num_target_layers + 1, verifier_cfg.hidden_size))
    if device_type == "cuda":
        summary["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if rank == 0:
        last = latest_epoch(output)
        if last is None:
            raise TrainError(f"training ended without a checkpoint in {output}")
        ckpt = output / str(last)
        check_checkpoint_config(ckpt)
        early = stopped is not None and stopped.early
        summary.update(checkpoint=str(ckpt), epochs_done=last + 1, steps=reporter.last_step, stopped_early=early, **reporter.last_val_summary())
        if early:
            events.message(f"early stop: {stopped.reason}; {reporter.last_step} of ~{recipe.total_steps} optimizer steps")
        elif stopped is not None:
            events.message(f"{stopped.reason} in epoch {stopped.epoch + 1} of {recipe.epochs}: the epochs left are not started")
        if str(ckpt) not in reporter.reported_checkpoints:
            events.artifact(str(ckpt), kind="checkpoint")
        best = read_best(output)
        if best is not None:
            summary.update(best_checkpoint=str(output / best["checkpoint"]), best_step=best["step"], best_tau=best["tau"])
        warning = reporter.still_learning_warning(args.speculative_tokens, last + 1)
        if warning:
            events.warning(warning)
    return summary


def replay_validations(early_stop: EarlyStop, curves: Path, last_epoch: int) -> None:
    """A resumed run's early stop picks up the validations of the epochs it resumes after (the
    curves file keeps them across resumes): a run stopped early and started again stops again."""
    from common.events import read_events

    if not curves.is_file():
        return
    taus: dict[int, float] = {}
    losses: dict[int, float] = {}
    for e in read_events(str(curves)):
        m = e.get("metrics") or {}
        epoch = m.get("epoch")
        if e.get("event") != "metric" or not isinstance(epoch, int) or epoch > last_epoch:
            continue
        if "tau" in m:
            taus[epoch] = float(m["tau"])
        if "val_loss" in m:
            losses[epoch] = float(m["val_loss"])
    for epoch in sorted(taus.keys() | losses.keys()):
        early_stop.update(epoch, taus.get(epoch), losses.get(epoch))


def early_stop_verdict(early_stop: EarlyStop, epoch: int, epochs: int, metrics: dict) -> str | None:
    """The reason to stop after epoch `epoch` (0-based) of `epochs`, given its validation metrics
    (speculators' names, `_epoch` suffixed), else None. After the last epoch there is nothing left
    to spare: the run ends as planned, not "stopped early"."""
    if epoch + 1 >= epochs:
        return None
    val = {k.removesuffix("_epoch"): v for k, v in metrics.items()}
    return early_stop.update(epoch, estimate_tau(val), val.get("loss"))


def rank0_verdict(reason: str | None) -> str | None:
    """Rank 0's early-stop verdict on every rank (only rank 0 keeps the history), so all stop together."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [reason]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return reason


def end_stopped_training() -> None:
    """What speculators' main does after run_training returns, which an early stop skipped."""
    import gc

    import torch
    from speculators.train.distributed import maybe_destroy_distributed

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    maybe_destroy_distributed()


def staging_dir(args: argparse.Namespace) -> Path:
    return Path(args.staging_dir or Path(args.output) / STAGING_DIR).resolve()


def online_disk(events: EventLog, staging: Path, prepared: Path, ranks: int, workers: int, saved_layers: int, hidden: int) -> dict[str, Any]:
    """The staging directory's measured peak against its bound (common/online.py); what is left
    in it is a warning (the launcher removes it)."""
    from common.online import measured_peak, staged_files, staging_bound

    longest = prepared_longest_row(prepared)
    bound = staging_bound(ranks, workers, longest, saved_layers, hidden)
    peak = measured_peak(staging)
    left = staged_files(staging)
    events.message(f"online: the hidden states peaked at {peak / 2**20:.2f} MiB on disk (bound {bound / 2**20:.2f} MiB: "
                   f"{ranks} rank(s) x 2 loaders x {max(1, workers)} process(es) x the longest row, {longest} tokens x {saved_layers} layers x {hidden} x 2 B)")
    if left:
        events.warning(f"online: {len(left)} file(s) left in {staging} after training (e.g. {left[0]}): requests that failed after vLLM wrote them; removed when the stage ends")
    return {"peak_staging_bytes": peak, "staging_bound_bytes": bound, "left_in_staging": len(left)}


def launch_online(args: argparse.Namespace, argv: list[str]) -> int:
    """train --online: start vllm serve, run this script as the trainer against it, stop the server."""
    from common.vllm_server import ServerFailed, StageCancelled

    events = EventLog(STAGE, args.events)
    events.started(**{k: v for k, v in vars(args).items() if k != "events"})
    try:
        code = serve_and_train(args, argv, events)
    except StageCancelled as e:
        events.finished("failed", error=f"{type(e).__name__}: {e}", cause="cancelled")
        return 1
    except Exception as e:  # one line; the traceback in the log unless the error explains itself
        return events.failed(e, traceback=not isinstance(e, (TrainError, ValueError, ServerFailed)))
    if code != 0 and not _ended_with_finished(args.events):
        events.finished("failed", error=f"TrainError: the trainer exited with status {code} without a word (killed?); see the stage log")
    return 0 if code == 0 else 1


def _ended_with_finished(events_path: str | None) -> bool:
    from common.events import read_events

    if not events_path or not Path(events_path).is_file():
        return True  # nothing to judge: no events file
    records = read_events(events_path)
    return bool(records) and records[-1].get("event") == "finished"


def serve_and_train(args: argparse.Namespace, argv: list[str], events: EventLog) -> int:
    import torch
    from transformers import AutoConfig

    from common.online import clear_staging, place_gpus, visible_gpus
    from common.verifier import check_target_layers, default_target_layers, num_hidden_layers
    from common.vllm_server import ManagedServer, hidden_state_server, private_socket, refuse_before_serving, run_supervised, sigterm_raises

    if under_torchrun():
        raise TrainError("train --online starts vLLM and torchrun itself: run it once per host, not under torchrun (a group run trains offline)")
    cuda = torch.cuda.is_available()
    placement = place_gpus(visible_gpus(dict(os.environ), torch.cuda.device_count() if cuda else 0), args.verifier_gpus, args.train_gpus, args.gpu_memory_utilization)
    tensor_parallel = args.tensor_parallel_size or max(1, len(placement.verifier))
    if placement.verifier and tensor_parallel > len(placement.verifier):
        raise TrainError(f"--tensor-parallel-size {tensor_parallel} needs as many verifier GPUs; verifier_gpus has {len(placement.verifier)}")
    args.verifier = verifier_path.resolve(args.verifier)  # the id vLLM serves = the name the trainer asks for
    config = AutoConfig.from_pretrained(args.verifier, trust_remote_code=args.trust_remote_code)
    connector = refuse_before_serving(args, config, what="train --online reads bf16 hidden states")
    n = num_hidden_layers(config)
    layers = check_target_layers(args.layers or default_target_layers(n), n)
    output = Path(args.output).resolve()
    staging = staging_dir(args)
    removed = clear_staging(staging)  # a crashed or cancelled run's leftovers: resume starts clean
    server_env, trainer_env = dict(os.environ), {**os.environ, ONLINE_CHILD_ENV: "1"}
    if placement.verifier:
        server_env["CUDA_VISIBLE_DEVICES"] = ",".join(placement.verifier)
        trainer_env["CUDA_VISIBLE_DEVICES"] = ",".join(placement.train)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={len(placement.train)}"] if len(placement.train) > 1 else [sys.executable]
    server_log = Path(args.server_log or output / "vllm_server.log")
    output.mkdir(parents=True, exist_ok=True)
    try:
        # a unix socket in a 0700 directory of this stage's: no other uid of the box reaches it
        with sigterm_raises(), private_socket() as uds:
            opts = hidden_state_server(args, layers, n, str(staging), uds, connector,
                                       tensor_parallel_size=tensor_parallel, gpu_memory_utilization=placement.gpu_memory_utilization)
            trainer = [os.path.abspath(__file__), *argv, "--verifier", args.verifier, "--layers", *map(str, layers),
                       "--vllm-endpoint", f"{opts.base_url}/v1", "--staging-dir", str(staging)]
            with ManagedServer(opts, server_log, stop_grace=args.stop_grace, env=server_env) as server:
                events.message(f"online: vllm serve on {opts.where} (its workers in {server.network}), layers {layers}, hidden-states connector {connector}, "
                               f"{placement.describe()}; log {server_log}" + (f"; removed {removed} file(s) a previous run left in {staging}" if removed else ""))
                waited = server.wait_healthy(args.health_timeout)
                events.message(f"online: vllm serve healthy after {waited:.0f} s; training from it")
                return run_supervised([*launcher, *trainer], None, server=server, grace=args.stop_grace, env=trainer_env)
    finally:
        clear_staging(staging)
        staging.rmdir()


# The estimate reads a few validation rows and swings between neighbouring epochs: on
# bench/quality's cpu size "the highest estimate" picked a middle epoch whose held-out tau was
# below the last one's. So a later checkpoint whose estimate is
# within this fraction of the highest one takes the best's place: trained longer, as good as the
# estimate can tell.
BEST_TAU_TOLERANCE = 0.05


class Reporter:
    """speculators' metric dicts -> events (rank 0 only); the tau estimate after each validation,
    and best.json when a checkpoint's estimate is within BEST_TAU_TOLERANCE of the highest so far."""

    def __init__(self, events: EventLog, rank: int, output: Path, epochs: int):
        self.events, self.rank, self.output, self.epochs = events, rank, output, epochs
        # The curves also live next to the checkpoints (evaluate plots them from there), so they
        # travel with the checkpoints whoever launched the run. Appended across resumes.
        self.curves = EventLog(STAGE, str(output / "metrics.jsonl"), echo=False) if rank == 0 else None
        self.steps_per_epoch = 0
        self.started = time.monotonic()
        self.last_step = 0
        self.last_val: dict[str, float] = {}
        self.reported_checkpoints: set[str] = set()
        self.val_losses: list[float] = []
        self.taus: list[float] = []
        best = read_best(output) if rank == 0 else None  # a resumed run keeps the best so far
        self.top_tau: float | None = best["tau"] if best else None  # the highest estimate so far

    def on_train(self, step: int, record: dict) -> None:
        if self.rank != 0:
            return
        self.last_step = step + 1
        train = record.get("train", {})
        metrics = {k: _round(v) for k, v in train.items() if _is_step_metric(k)}
        profile = record.get("profile") or {}
        if "tokens_per_s" in profile:
            metrics["tokens_per_s"] = round(float(profile["tokens_per_s"]), 1)
        lr = record.get("lr")
        if isinstance(lr, (int, float)):
            metrics["lr"] = float(f"{lr:.4g}")
        metrics["epoch"] = record.get("epoch", 0)
        self.events.metric(step + 1, **metrics)
        self.curves.metric(step + 1, **metrics)
        if self.steps_per_epoch:
            # len(train_loader) is the first epoch's packing: each epoch's shuffle packs into a
            # few more or fewer steps, and a bar must not read 140/138.
            self.events.progress(step + 1, max(step + 1, self.steps_per_epoch * self.epochs), unit="steps")

    def on_val(self, epoch: int, step: int, record: dict) -> None:
        if self.rank != 0:
            return
        val = {k.removesuffix("_epoch"): v for k, v in record.get("val", {}).items()}
        self.last_val = {k: _round(v) for k, v in val.items() if _is_step_metric(k)}
        val_metrics = {f"val_{k}": v for k, v in self.last_val.items()}
        self.events.metric(step, **val_metrics, epoch=epoch)
        self.curves.metric(step, **val_metrics, epoch=epoch)
        if "loss" in self.last_val:
            self.val_losses.append(self.last_val["loss"])
        ckpt = self.output / str(epoch)
        if (ckpt / "config.json").is_file() and str(ckpt) not in self.reported_checkpoints:
            self.reported_checkpoints.add(str(ckpt))
            self.events.artifact(str(ckpt), kind="checkpoint")
        tau = self._tau(step, self.last_val, epoch=epoch)
        # The epoch's checkpoint was saved before its validation: it is the one this tau measured.
        if tau is not None and is_checkpoint(ckpt) and (self.top_tau is None or tau >= self.top_tau * (1 - BEST_TAU_TOLERANCE)):
            write_best(self.output, ckpt.name, step, tau)
            self.events.message(f"best checkpoint so far: {ckpt} (step {step}, estimated tau {tau:.2f})")
        if tau is not None:
            self.top_tau = max(tau, self.top_tau or tau)

    def on_tau_probe(self, step: int, metrics: dict) -> None:
        """A mid-epoch estimate on a few validation batches (no checkpoint to go with it)."""
        if self.rank == 0:
            self._tau(step, metrics)

    def _tau(self, step: int, metrics: dict, **extra: Any) -> float | None:
        tau = estimate_tau(metrics)  # rounds walked (common/acceptance.py); the per-position figure beside it reads high
        if tau is not None:
            per_position = per_position_tau(metrics)
            if per_position is not None:
                extra["tau_per_position"] = per_position
            self.taus.append(tau)
            self.events.metric(step, tau=tau, **extra)
            self.curves.metric(step, tau=tau, **extra)
        return tau

    def still_learning_warning(self, k: int, epochs: int) -> str | None:
        return still_learning_warning(self.val_losses, self.taus, k, epochs, self.last_step)

    def last_val_summary(self) -> dict[str, float]:
        return {f"val_{k}": v for k, v in self.last_val.items() if k.startswith(("full_acc_", "loss"))}


def _is_step_metric(key: str) -> bool:
    # loss, loss_<t>, full_acc_<t> (accuracy of TTT step t), cond_acc_<t> (given steps < t right),
    # round_tau (validation's rounds walked: common/acceptance.py)
    return key in ("loss", ROUND_TAU) or key.startswith(("loss_", "full_acc_", "cond_acc_"))


def _round(v: Any) -> float:
    v = float(v)
    return v if math.isnan(v) else round(v, 5)


# ---------------------------------------------------------------------------------------------
# Inputs and guards


def extraction_layers(hs_dir: Path) -> list[int] | None:
    """The layer ids recorded by the extract stage, if it left a record next to its files."""
    for name in ("extract_meta.json", "extraction.json", "metadata.json"):
        f = hs_dir / name
        if f.is_file():
            meta = json.loads(f.read_text())
            for key in ("layers", "target_layer_ids", "aux_layer_ids", "layer_ids"):
                if isinstance(meta.get(key), list):
                    return [int(x) for x in meta[key]]
    return None


def check_first_hidden_states(hs_dir: Path, num_target_layers: int, hidden_size: int) -> None:
    from safetensors import safe_open

    first = hs_dir / "hs_0.safetensors"
    if not first.is_file():
        raise TrainError(f"--hidden-states {hs_dir}: no hs_0.safetensors (run the extract stage first)")
    with safe_open(str(first), framework="pt") as f:
        keys = set(f.keys())
        if not {"hidden_states", "token_ids"} <= keys:
            raise TrainError(f"{first}: expected tensors hidden_states and token_ids, found {sorted(keys)}")
        sl = f.get_slice("hidden_states")
        check_hidden_state_layout(tuple(sl.get_shape()), sl.get_dtype(), num_target_layers, hidden_size)


def resolve_mask_token_id(explicit: int | None, verifier: str, verifier_cfg, trust_remote_code: bool = False) -> tuple[int, str]:
    """The id handed to speculators as --mask-token-id, so that it never loads the verifier's
    processor (common/speculators_compat.py, shim 'mask-token'); with where it came from."""
    if explicit is not None:
        return explicit, "--mask-token-id"
    from common.speculators_compat import mask_token_id

    return mask_token_id(verifier, int(verifier_cfg.vocab_size), trust_remote_code)


def guard_model(model, device_type: str, verifier: str) -> None:
    """Preflight on the built draft, before the trainer moves it or takes a step."""
    import torch

    from common.draft_attention import check_draft_attention

    check_draft_attention(model, device_type)
    not_fp32 = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype != torch.float32})
    if not_fp32:
        raise TrainError(f"trainable draft weights are {not_fp32}: the trainer keeps fp32 master weights (bf16 only under autocast)")
    recorded = model.config.speculators_config.verifier.name_or_path
    if Path(verifier).is_absolute() and recorded != verifier:
        raise TrainError(f"the draft config records verifier {recorded!r}, expected the absolute path {verifier!r}")


def check_checkpoint_config(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    name = cfg.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    if not name:
        raise TrainError(f"{ckpt}/config.json records no verifier path")
    if name.startswith((".", "~")) or (not os.path.isabs(name) and os.path.exists(name)):
        raise TrainError(f"{ckpt}/config.json records a relative verifier path {name!r}")


def latest_epoch(output: Path) -> int | None:
    """The highest epoch checkpoint under `output` (directories named by number, with weights)."""
    latest = latest_checkpoint(output)
    return int(latest.name) if latest is not None else None


def prepared_longest_row(prepared: Path) -> int:
    """The longest prepared row, validation rows included (both loaders ask vLLM)."""
    from datasets import load_from_disk

    import numpy as np

    return int(np.asarray(load_from_disk(str(prepared)).with_format("numpy")["seq_len"]).max())


def prepared_data_size(prepared: Path, train_data_ratio: float) -> DataSize:
    """Tokens in the rows speculators trains on: the first int(rows x ratio) rows (its ArrowDataset
    split), counted from the prepared dataset's seq_len column."""
    from datasets import load_from_disk

    data = load_from_disk(str(prepared))
    if "seq_len" not in data.column_names:
        raise TrainError(f"--prepared {prepared}: no seq_len column (prepare it with prepare_data.py)")
    lengths = data.with_format("numpy")["seq_len"][: int(len(data) * train_data_ratio)]
    if len(lengths) == 0:
        raise TrainError(f"--prepared {prepared}: no training rows ({len(data)} rows, --train-data-ratio {train_data_ratio})")
    return DataSize(train_tokens=int(lengths.sum()), longest_row=int(lengths.max()))


if __name__ == "__main__":  # guard: dataloader workers are spawned and re-import this module
    sys.exit(main())
