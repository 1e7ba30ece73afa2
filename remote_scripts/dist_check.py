"""A small, real torch.distributed job that checks its own results: the multi-node smoke test.

Launched by torchrun on every node (`harness run GROUP dist_check`); it runs anywhere torch runs:
Gloo on CPU (the CI namespace hosts), NCCL on GPUs. speculators' trainer refuses CPU distributed,
so this is what proves a multi-host launch end to end without GPUs; on GPUs the same launch path
runs the real train stage. It checks an all_reduce and DDP training steps against exact
references; any mismatch fails the stage (exit 1). What it checks: docs/architecture/group-runs.md, "A
group run on the GPU side".

Run by hand on one machine:
    torchrun --nproc-per-node 2 remote_scripts/dist_check.py --steps 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from typing import NoReturn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.events import EventLog  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="DDP training steps")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--width", type=int, default=32, help="hidden width of the MLP")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (tests kill a node mid-run)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="auto: nccl with CUDA, else gloo")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait for a peer before failing")
    p.add_argument("--events", default=None, help="events.jsonl path (local rank 0 writes it)")
    p.add_argument("--fail-rank", type=int, default=-1, help="this global rank exits with an error at --fail-step (tests)")
    p.add_argument("--fail-step", type=int, default=1)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    # Only each node's first process writes events; every process echoes to its log.
    events = EventLog("dist_check", args.events if local_rank == 0 else None, echo=local_rank == 0)
    if local_rank != 0:
        events.path = None  # not even through $HARNESS_EVENTS
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tag = f"rank {rank}/{world} on {socket.gethostname()}"
    events.started(rank=rank, world_size=world, backend=backend, steps=args.steps, node_rank=os.environ.get("GROUP_RANK"))
    try:
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout), device_id=device if device.type == "cuda" else None)
        else:  # run by hand without torchrun: a world of one
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        print(f"[dist_check] {tag}: process group up ({backend}, master {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')})", flush=True)
        check_all_reduce(dist, torch, device, rank, world)
        events.message(f"all_reduce over {world} ranks: ok")
        check_ddp(dist, torch, device, rank, world, args, events)
        dist.barrier()
    except CheckFailed as e:
        print(f"[dist_check] {tag}: CHECK FAILED: {e}", file=sys.stderr, flush=True)
        events.finished("failed", error=str(e))
        exit_now(1)
    except Exception as e:  # a peer died, a timeout, ...: say which rank saw it
        print(f"[dist_check] {tag}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        events.finished("failed", error=f"{type(e).__name__}: {str(e)[:300]}")
        exit_now(1)
    dist.destroy_process_group()
    print(f"[dist_check] {tag}: all checks passed", flush=True)
    events.finished("ok", world_size=world)
    exit_now(0)


class CheckFailed(Exception):
    pass


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown, once every line and event is written.

    On failure: no destroy_process_group either. With NCCL it waits for the peers' collectives,
    so a failed rank would hang until the others time out (minutes) instead of failing the job
    at once. torchrun sees the exit and stops this node; the peers' collectives then fail.

    On success too: Gloo's worker threads (pt_gloo_runloop, gloo_tcp_loop) outlive
    destroy_process_group, and tearing the interpreter down around them sometimes aborts the
    rank after it passed every check ("terminate called without an active exception", SIGABRT;
    about 1 run in 12 here with the CPU loaded). torchrun then fails node 0, its rendezvous
    store goes away, and every other node fails with it: a green run reported red."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_all_reduce(dist, torch, device, rank: int, world: int) -> None:
    n = 1024
    t = torch.arange(n, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device) * (rank + 1)
    dist.all_reduce(t)
    expected = torch.arange(n, dtype=t.dtype, device=device) * (world * (world + 1) / 2)
    if not torch.equal(t, expected):
        bad = (t != expected).nonzero()[0].item()
        raise CheckFailed(f"all_reduce: element {bad} is {t[bad].item()}, expected {expected[bad].item()}")


def _model(torch, width: int):
    torch.manual_seed(1234)  # every rank (and the reference) starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def check_ddp(dist, torch, device, rank: int, world: int, args, events: EventLog) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(torch, args.width).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    reference = _model(torch, args.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        if step == args.fail_step and rank == args.fail_rank:
            raise CheckFailed(f"rank {rank} fails at step {step} as asked (--fail-rank)")
        x = torch.randn(args.batch, 16, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()

        # The reference sees every rank's batch at once: mean loss over world*batch samples.
        xs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(xs, x)
        x_all = torch.cat(xs)
        ref_loss = torch.nn.functional.mse_loss(reference(x_all), x_all.sum(dim=1, keepdim=True).sin())
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()

        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for other, g in enumerate(gathered):
            if not torch.equal(g, gathered[0]):
                raise CheckFailed(f"step {step}: parameters of rank {other} differ from rank 0 (max {float((g - gathered[0]).abs().max()):.3g})")
        ref_flat = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
        err = float((flat - ref_flat).abs().max())
        if err > 1e-4:
            raise CheckFailed(f"step {step}: DDP parameters differ from the full-batch reference by {err:.3g}")
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        events.progress(step, args.steps, unit="steps")
        events.metric(step, loss=float(global_loss) / world, ref_error=err)
        if args.step_seconds:
            time.sleep(args.step_seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
