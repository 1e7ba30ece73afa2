"""The training recipe sized to the data: tokens per optimizer step and epochs, so that a run gets
enough optimizer steps to learn.

The fast GPU default packs 8192 tokens per step (per process); on a small data set that leaves a
handful of steps and a draft that learns almost nothing. For the values the user did not set,
tokens per step is halved while the run would get fewer than MIN_STEPS steps (down to the
longest row's power of two), and epochs are raised (at most MAX_EPOCHS) toward the device's
TARGET_STEPS; warm-up follows the sized count. A value the user set is kept; a run that will still
get too few steps gets one warning line naming the numbers and the fix. The epochs are the most
a run trains (train's early stop may end it sooner). The rule, with the measurements behind each
number: docs/pipeline.md, "Training"; docs/architecture/gpu-side.md, common/recipe.py.

Pure (no torch): tests/test_recipe.py checks it on tiny, small and large data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_STEPS = 300  # optimizer steps a run needs (fewer: a smaller pack, else a warning); the CPU demo reached tau 3.64 at 327
# Steps the epochs are raised to (the pack stays), per device: about where held-out tau stopped
# rising in bench/quality/run.py (the cpu size on a CPU, SmolLM2's gpu size on an H200).
TARGET_STEPS = {"cpu": 1000, "cuda": 6400}
DEFAULT_TOKENS_PER_STEP = {"cpu": 512, "cuda": 8192}
MIN_TOKENS_PER_STEP = 256
DEFAULT_EPOCHS = 3
MAX_EPOCHS = 20  # speculators' own default; more epochs of the same few rows only memorise them
# Long runs: tau is also estimated every TAU_EVERY_STEPS steps when an epoch is longer than
# LONG_EPOCH_STEPS (else once per epoch, after validation).
LONG_EPOCH_STEPS = 2000
TAU_EVERY_STEPS = 1000


# max_seq_len = 0: the longest row, rounded up to a multiple of SEQ_LEN_STEP, at most
# AUTO_MAX_SEQ_LEN (a longer row is cut, and prepare says how many were): every reply whole where
# the data allows, and no padding-sized limit where the rows are short.
AUTO_MAX_SEQ_LEN = 4096
SEQ_LEN_STEP = 64


def sized_seq_len(longest_row: int) -> int:
    """The sequence-length limit sized to the data (max_seq_len = 0)."""
    return max(SEQ_LEN_STEP, min(AUTO_MAX_SEQ_LEN, -(-longest_row // SEQ_LEN_STEP) * SEQ_LEN_STEP))


@dataclass(frozen=True)
class DataSize:
    train_tokens: int  # tokens in the rows the trainer trains on (not the validation rows)
    longest_row: int


@dataclass(frozen=True)
class Recipe:
    tokens_per_step: int  # per process (speculators' --total-seq-len)
    epochs: int
    processes: int
    steps_per_epoch: int
    total_steps: int  # epochs x steps per epoch, or --max-steps when lower
    sized: tuple[str, ...]  # what the rule chose: "tokens_per_step", "epochs"
    tau_every: int | None  # steps between tau estimates inside an epoch; None: at epoch ends only
    warning: str | None  # one line when the run gets fewer than MIN_STEPS steps

    def describe(self) -> str:
        chosen = f" (sized to the data: {', '.join(self.sized)})" if self.sized else ""
        return (
            f"recipe: {self.tokens_per_step} tokens per step x {_count(self.processes, 'process')}, {_count(self.epochs, 'epoch')}, "
            f"~{self.steps_per_epoch} steps per epoch, ~{_count(self.total_steps, 'optimizer step')}{chosen}"
        )


def steps_per_epoch(train_tokens: int, tokens_per_step: int, processes: int) -> int:
    return max(1, math.ceil(train_tokens / (tokens_per_step * processes)))


def floor_tokens_per_step(longest_row: int, default: int) -> int:
    """The smallest pack the rule uses: holds the longest row (power of two), never above the default."""
    fit = 1 << max(0, longest_row - 1).bit_length()
    return min(default, max(MIN_TOKENS_PER_STEP, fit))


def size_recipe(
    data: DataSize,
    processes: int,
    device_type: str,
    *,
    tokens_per_step: int | None = None,
    epochs: int | None = None,
    max_steps: int | None = None,
    min_steps: int = MIN_STEPS,
    target_steps: int | None = None,
) -> Recipe:
    """The recipe for `data` on `processes` processes of `device_type` ("cpu" or "cuda");
    `tokens_per_step`, `epochs` and `max_steps` are the user's values (None: unset)."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    device = "cpu" if device_type == "cpu" else "cuda"
    default = DEFAULT_TOKENS_PER_STEP[device]
    target_steps = TARGET_STEPS[device] if target_steps is None else target_steps
    floor = floor_tokens_per_step(data.longest_row, default)
    planned_epochs = epochs or DEFAULT_EPOCHS
    sized: list[str] = []

    tps = tokens_per_step
    if tps is None:
        tps = default
        while tps > floor and planned_epochs * steps_per_epoch(data.train_tokens, tps, processes) < min_steps:
            tps = max(floor, tps // 2)
        if tps != default:
            sized.append("tokens_per_step")
    per_epoch = steps_per_epoch(data.train_tokens, tps, processes)

    n_epochs = planned_epochs
    if epochs is None and n_epochs * per_epoch < target_steps:
        n_epochs = min(MAX_EPOCHS, math.ceil(target_steps / per_epoch))
        sized.append("epochs")

    total = n_epochs * per_epoch
    if max_steps:
        total = min(total, max_steps)
    warning = None
    if total < min_steps:
        warning = _starved(data, processes, tps, n_epochs, per_epoch, total, min_steps, floor, tokens_per_step, max_steps)
    tau_every = TAU_EVERY_STEPS if per_epoch > LONG_EPOCH_STEPS else None
    return Recipe(tps, n_epochs, processes, per_epoch, total, tuple(sized), tau_every, warning)


def _starved(data: DataSize, processes: int, tps: int, n_epochs: int, per_epoch: int, total: int, min_steps: int, floor: int, user_tps: int | None, max_steps: int | None) -> str:
    """The warning: the numbers, then the changes that give more steps (the smallest pack that
    reaches min_steps at these epochs, or the floor; the epochs; the data)."""
    fixes = []
    if max_steps and max_steps < min_steps <= n_epochs * per_epoch:
        fixes.append(f"raise --max-steps to {min_steps} or drop it")
    else:
        if user_tps and tps > floor:
            smaller = floor
            for candidate in (tps // 2 ** i for i in range(1, 16)):
                if candidate < floor:
                    break
                if n_epochs * steps_per_epoch(data.train_tokens, candidate, processes) >= min_steps:
                    smaller = candidate
                    break
            fixes.append(f"--total-seq-len {smaller} (or leave it unset)")
        fixes.append(f"--epochs {math.ceil(min_steps / per_epoch)}")
        fixes.append(f"about {math.ceil(min_steps / n_epochs) * tps * processes:,} training tokens of data")
    return (
        f"this run gets {_count(total, 'optimizer step')} ({data.train_tokens:,} training tokens / ({tps} tokens per step x "
        f"{_count(processes, 'process')}) = {per_epoch} per epoch x {_count(n_epochs, 'epoch')}"
        + (f", --max-steps {max_steps}" if max_steps and max_steps < n_epochs * per_epoch else "")
        + f"), fewer than the {min_steps} a draft needs to learn: fix: " + ", or ".join(fixes)
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"
