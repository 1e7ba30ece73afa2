"""Online training (train --online): the draft trains from a running `vllm serve`, never from a full
copy of the hidden states on disk.

speculators 0.9.0 already has the mechanism (ArrowDataset with `--on-missing generate`): for a row
without its hs_<i>.safetensors the dataloader asks `--vllm-endpoint`, loads the one file vLLM's
hidden-states connector wrote, and deletes it; each epoch asks again, so nothing is kept. What
this module adds, pure where it can be (tests/test_online.py): GPU placement on one box
(`place_gpus`: which GPUs serve the verifier, which train the draft; an overlap that leaves the
trainer too little is refused), the staging directory's bound (`staging_bound`) and its measured
peak (`measured_peak`, of what common/speculators_compat.py's MeasuredTransfer records). How the
mechanism runs, the bound's reasoning and why the measurement is the peak itself: docs/architecture/common-modules.md, common/online.py; for users:
docs/pipeline.md, "Online training".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# A GPU both sets use: vLLM's --gpu-memory-utilization is the share it takes (weights, activations,
# KV cache); the draft's training needs the rest. Below this fraction left for it, refuse.
MIN_TRAIN_FRACTION = 0.2
SHARED_UTILIZATION = 0.5  # vLLM's share of a GPU it shares with training when the user set none
PEAK_PREFIX = ".peak."
FILE_OVERHEAD = 4096  # per file: the safetensors header (~200 B) and the writer's empty .lock file, rounded up


class PlacementError(ValueError):
    """GPU sets for the verifier and the trainer that cannot work; one line."""


@dataclass(frozen=True)
class Placement:
    verifier: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries of vLLM
    train: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries of the trainer (torchrun over them)
    gpu_memory_utilization: float | None  # what vLLM is given (None: vLLM's default)

    @property
    def shared(self) -> tuple[str, ...]:
        return tuple(g for g in self.verifier if g in self.train)

    def describe(self) -> str:
        if not self.verifier:
            return "no GPUs: vLLM and the trainer on the CPU"
        share = f" (shared: {','.join(self.shared)}, vLLM takes {self.gpu_memory_utilization} of each)" if self.shared else ""
        return f"vLLM on GPU {','.join(self.verifier)}, training on GPU {','.join(self.train)}{share}"


def visible_gpus(env: dict[str, str], device_count: int) -> list[str]:
    """The names to put in CUDA_VISIBLE_DEVICES for each visible GPU (its own, when it is set)."""
    listed = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:device_count] if listed else [str(i) for i in range(device_count)]


def place_gpus(visible: list[str], verifier: list[int] | None, train: list[int] | None, gpu_memory_utilization: float | None) -> Placement:
    """Which GPUs serve the verifier and which train, as indices into `visible` (the defaults: the
    first half serves, the rest trains; one GPU is shared)."""
    n = len(visible)
    if n == 0:
        if verifier or train:
            raise PlacementError(f"verifier_gpus {verifier} / train_gpus {train} set, but this host has no GPU visible")
        return Placement((), (), gpu_memory_utilization)
    if verifier is None and train is None:
        verifier = list(range(max(1, n // 2)))
        train = list(range(n // 2, n)) if n > 1 else [0]
    elif verifier is None:
        verifier = [i for i in range(n) if i not in train] or list(range(n))
    elif train is None:
        train = [i for i in range(n) if i not in verifier] or list(range(n))
    for name, ids in (("verifier_gpus", verifier), ("train_gpus", train)):
        if not ids:
            raise PlacementError(f"{name} is empty")
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise PlacementError(f"{name} {ids}: no GPU {bad[0]} on this host ({n} visible: 0..{n - 1})")
        if len(set(ids)) != len(ids):
            raise PlacementError(f"{name} {ids} names a GPU twice")
    shared = sorted(set(verifier) & set(train))
    utilization = gpu_memory_utilization
    if shared:
        if utilization is None:
            utilization = SHARED_UTILIZATION
        if utilization > 1 - MIN_TRAIN_FRACTION:
            raise PlacementError(
                f"GPU {','.join(visible[i] for i in shared)} would serve the verifier and train the draft, but vLLM takes "
                f"{utilization} of its memory (--gpu-memory-utilization), leaving {1 - utilization:.2f}, under the "
                f"{MIN_TRAIN_FRACTION} training needs: set verifier_gpus and train_gpus apart, or gpu_memory_utilization <= {1 - MIN_TRAIN_FRACTION:.1f}"
            )
    return Placement(tuple(visible[i] for i in verifier), tuple(visible[i] for i in train), utilization)


# ---------------------------------------------------------------------------------------------
# Disk


def sample_bytes(tokens: int, saved_layers: int, hidden: int) -> int:
    """One generated file: bf16 states [T, k+1, H], int64 token ids [T], header and lock file."""
    return tokens * (saved_layers * hidden * 2 + 8) + FILE_OVERHEAD


def files_in_flight(ranks: int, workers: int) -> int:
    """Dataloader processes that can each hold one generated file: per rank, the training and the
    validation loader (a mid-epoch tau probe reads validation while the training loader's workers
    prefetch), each its workers or, with none, the rank itself."""
    return ranks * 2 * max(1, workers)


def staging_bound(ranks: int, workers: int, longest_row: int, saved_layers: int, hidden: int) -> int:
    return files_in_flight(ranks, workers) * sample_bytes(longest_row, saved_layers, hidden)


def staging_bytes(staging: Path) -> int:
    """Bytes of the files vLLM's connector left in `staging` (our own .peak records excluded)."""
    total = 0
    try:
        entries = list(os.scandir(staging))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.startswith(PEAK_PREFIX):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
            elif entry.is_dir(follow_symlinks=False):
                total += staging_bytes(Path(entry.path))
        except FileNotFoundError:  # deleted meanwhile by another loader process
            continue
    return total


def staged_files(staging: Path) -> list[str]:
    """What is left in `staging` besides our records (empty after a clean run)."""
    if not staging.is_dir():
        return []
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file() and not p.name.startswith(PEAK_PREFIX))


def measured_peak(staging: Path) -> int:
    peaks = [int(p.read_text() or 0) for p in staging.glob(PEAK_PREFIX + "*")] if staging.is_dir() else []
    return max(peaks, default=0)


def clear_staging(staging: Path) -> int:
    """Remove what a crashed or cancelled run left (files and records); returns how many files."""
    removed = 0
    if staging.is_dir():
        for p in sorted(staging.rglob("*"), reverse=True):
            if p.is_file() or p.is_symlink():
                p.unlink()
                removed += 1
            elif p.is_dir():
                p.rmdir()
    staging.mkdir(parents=True, exist_ok=True)
    return removed
