"""Which samples a rank of a distributed stage handles, and in which batches (pure logic: no torch).

extract_hidden_states.py and regenerate.py split their work the same way: `--rank/--world-size`
(or torchrun's RANK/WORLD_SIZE) give each rank a contiguous range of sample indices, the same
split as speculators' get_indices_to_process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from common.events import EventLog, run_stage


def shard_range(num_samples: int, rank: int, world_size: int) -> range:
    """Contiguous sample indices of `rank`: chunks differ by at most one (speculators' split)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    chunk, remainder = divmod(num_samples, world_size)
    start = rank * chunk + min(rank, remainder)
    return range(start, start + chunk + (1 if rank < remainder else 0))


def resolve_rank(args: argparse.Namespace) -> tuple[int, int, int]:
    """(rank, world_size, local_rank): flags win, then torchrun's environment, then 0/1/0."""
    env = os.environ
    world = args.world_size if args.world_size is not None else int(env.get("WORLD_SIZE", 1))
    rank = args.rank if args.rank is not None else int(env.get("RANK", 0))
    local = int(env.get("LOCAL_RANK", 0))  # picks the GPU; a flag-launched process per host uses cuda:0
    shard_range(0, rank, world)  # validates
    return rank, world, local


def run_sharded_stage(stage: str, args: argparse.Namespace, run: Callable[..., dict[str, Any]], **options: Any) -> int:
    """main() of a stage whose processes each take a shard of the samples: the rank resolved (a
    bad one: the stage's failed event, exit 1), then run_stage with `run(args, events, rank,
    world_size, local_rank)` and the resolved rank in the started event."""
    try:
        rank, world, local_rank = resolve_rank(args)
    except ValueError as e:
        EventLog(stage, args.events).finished("failed", error=str(e))
        return 1
    return run_stage(stage, args, lambda args, events: run(args, events, rank, world, local_rank), rank=rank,
                     started={"resolved_rank": rank, "resolved_world_size": world}, **options)


def plan_batches(lengths: dict[int, int], batch_size: int, max_tokens: int, tail_rows: int = 0) -> list[list[int]]:
    """Group sample indices by similar length (less padding), each batch <= batch_size rows and
    <= max_tokens padded tokens (a long row still gets a batch of its own).

    Longest rows first: a batch too large for the GPU fails in the first seconds rather than at
    the end, and the last batch, whose files no later compute hides, is the smallest. With
    `tail_rows` > 0 the last batch is split further into batches of that many rows, so its first
    files are written while its last rows compute (the final drain is one small batch)."""
    order = sorted(lengths, key=lambda i: (-lengths[i], i))
    batches, current = [], []
    for i in order:
        width = max([lengths[j] for j in current] + [lengths[i]])
        if current and (len(current) >= batch_size or width * (len(current) + 1) > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if tail_rows > 0 and batches and len(batches[-1]) > tail_rows:
        last = batches.pop()
        batches += [last[k : k + tail_rows] for k in range(0, len(last), tail_rows)]
    return batches
