"""Acceptance while the draft trains: tau estimated from speculators' validation accuracies, and
the guard that names a run which stopped while the draft was still learning. Pure (no torch).

The per-position figure from speculators' validation, 1 + sum_t full_acc_t, reads HIGH: a round
starts where the last one ended, so hard stretches hold more round starts than easy ones. The
estimate the train stage reports walks the rounds instead (`walk_rounds`, fed by the shim
'round-walk' of common/speculators_compat.py): tau = tokens / rounds along each validation reply;
`estimate_tau` falls back to the per-position sum where the walk is missing. The guard warns
when training ends while the estimate or the loss still moves; the early stop (`EarlyStop`) is
its mirror: an estimate flat at its best for `patience` epoch validations in a row, with no
other sign of learning, ends training. The derivation, what separates the estimate from
evaluate's tau, and the measurements behind the rules: docs/pipeline.md, "Training";
docs/architecture/common-modules.md, common/acceptance.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The guard: over the last interval between two measurements, an estimated tau that still rose by
# more than TAU_RISE, or a validation loss that still fell by more than LOSS_DROP (relative) while
# the estimate is below TAU_CEILING of its ceiling k + 1, means the run stopped while the draft was
# learning. Near the ceiling a falling loss only sharpens distributions whose argmax already
# matches: the CPU demo's last epoch cut its validation loss by 21% with tau flat at 3.80 of 4.
TAU_RISE = 0.05
LOSS_DROP = 0.1
TAU_CEILING = 0.9

# Epoch validations in a row with the estimate flat at its best that end training (train
# --early-stop-patience); flat: within FLAT (relative) below the best.
EARLY_STOP_PATIENCE = 3
FLAT = 0.005

_FULL_ACC = re.compile(r"full_acc_(\d+)")


ROUND_TAU = "round_tau"  # the walked estimate's metric (speculators divides its _sum by its _total)


def walk_rounds(accepted: list[int], in_reply: list[bool]) -> tuple[int, int]:
    """(tokens, rounds) of chain speculation along one packed row: `accepted[p]` is the number of
    leading draft proposals the verifier accepts from position p, `in_reply[p]` whether p is a
    reply position (the loss mask). Each maximal run of reply positions is one reply."""
    tokens = rounds = 0
    p, n = 0, len(accepted)
    while p < n:
        if not in_reply[p]:
            p += 1
            continue
        end = p
        while end < n and in_reply[end]:
            end += 1
        while p < end:  # the rounds of this reply
            step = min(accepted[p], end - p - 1) + 1  # accepted proposals + the verifier's token
            tokens, rounds, p = tokens + step, rounds + 1, p + step
    return tokens, rounds


def per_position_tau(metrics: dict[str, float]) -> float | None:
    """1 + the sum of full_acc_<t> over the TTT steps in `metrics` (None when there are none):
    the per-position figure, which reads high (module docstring)."""
    accs = [float(v) for k, v in metrics.items() if _FULL_ACC.fullmatch(k)]
    if not accs:
        return None
    return round(1.0 + sum(min(1.0, max(0.0, a)) for a in accs), 4)


def estimate_tau(metrics: dict[str, float]) -> float | None:
    """The rounds walked (metric round_tau) where validation recorded them, else the per-position
    figure; None when there is neither, and when the walk found no round (speculators gives 0
    for a count of 0: validation rows without a reply position measure nothing)."""
    if ROUND_TAU in metrics:
        walked = float(metrics[ROUND_TAU])
        return round(walked, 4) if walked >= 1.0 else None
    return per_position_tau(metrics)


def still_learning(val_losses: list[float], taus: list[float], k: int) -> str | None:
    """What says the draft (k proposals) was still learning when training ended (None: it had
    levelled off, or there are fewer than two measurements of each)."""
    signs = []
    below_ceiling = not taus or taus[-1] < TAU_CEILING * (k + 1)
    if len(val_losses) >= 2 and val_losses[-2] > 0 and below_ceiling:
        drop = (val_losses[-2] - val_losses[-1]) / val_losses[-2]
        if drop > LOSS_DROP:
            signs.append(f"validation loss still fell {drop:.0%} ({val_losses[-2]:.4g} -> {val_losses[-1]:.4g})")
    if len(taus) >= 2 and taus[-1] - taus[-2] > TAU_RISE:
        signs.append(f"estimated tau still rose {taus[-2]:.2f} -> {taus[-1]:.2f}")
    if not signs:
        return None
    return " and ".join(signs) + " over the last measurement"


def still_learning_warning(val_losses: list[float], taus: list[float], k: int, epochs: int, steps: int) -> str | None:
    """The guard's one warning line, with the fix."""
    sign = still_learning(val_losses, taus, k)
    if sign is None:
        return None
    return (
        f"training ended while the draft was still learning: {sign}, after {steps} optimizer steps in {epochs} epochs; "
        f"fix: more steps (--epochs {epochs * 2}, or a smaller --total-seq-len) or more data"
    )


@dataclass
class EarlyStop:
    """Whether to end training after an epoch's validation: its estimate has stood flat at the
    best so far (within FLAT below it) for `patience` validations in a row, and `still_learning`
    sees no sign (a validation loss still falling fast below the ceiling). patience 0: never."""

    patience: int
    k: int  # proposals per round: the estimate's ceiling is k + 1
    best: float | None = None
    best_epoch: int | None = None
    stale: int = 0  # validations since the best
    val_losses: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)

    def update(self, epoch: int, tau: float | None, val_loss: float | None) -> str | None:
        """Record epoch `epoch`'s validation; the reason to stop after it, else None."""
        if val_loss is not None:
            self.val_losses.append(val_loss)
        if tau is None:
            return None  # nothing measured: no evidence either way
        self.taus.append(tau)
        if self.best is None or tau > self.best:
            self.best, self.best_epoch, self.stale = tau, epoch, 0
            return None
        if tau < self.best * (1 - FLAT):
            self.stale = 0  # it moved: noise or a run still changing, no sign that it is done
            return None
        self.stale += 1
        if self.patience < 1 or self.stale < self.patience or still_learning(self.val_losses, self.taus, self.k):
            return None
        return (f"the estimated tau has stood flat at {self.best:.4f} (epoch {self.best_epoch}) for {self.stale} validations: "
                f"stopped after epoch {epoch} (--early-stop-patience 0 trains every epoch)")
