"""Acceptance while the draft trains: tau estimated from speculators' validation accuracies, and
the guard that names a run which stopped while the draft was still learning.

The estimate. speculators' validation pass runs the draft's k TTT steps over held-out rows (the
rows after --train-data-ratio) and counts, per step t, `full_acc_t`: the fraction of positions
whose proposals 1..t all equal the verifier's greedy token (argmax of the verifier's own logits
from its last hidden state). A chain of k proposals yields 1 + (number accepted) tokens, and the
expected number accepted is the sum over t of P(proposals 1..t all accepted), so

    tau ~= 1 + sum_t full_acc_t

It differs from the evaluate stage's tau in two ways: a TTT step feeds the data's next token where
inference feeds the draft's own (the same whenever the data follows the verifier's greedy path),
and it counts every position of an assistant reply instead of whole speculation rounds. It costs
nothing beyond the validation pass speculators runs anyway (each epoch); long epochs add a
validation over a few batches every few thousand steps (common/recipe.py).

Pure (no torch).
"""

from __future__ import annotations

import re

# The guard: over the last interval between two measurements, an estimated tau that still rose by
# more than TAU_RISE, or a validation loss that still fell by more than LOSS_DROP (relative) while
# the estimate is below TAU_CEILING of its ceiling k + 1, means the run stopped while the draft was
# learning. Near the ceiling a falling loss only sharpens distributions whose argmax already
# matches: the CPU demo's last epoch cut its validation loss by 21% with tau flat at 3.80 of 4.
TAU_RISE = 0.05
LOSS_DROP = 0.1
TAU_CEILING = 0.9

_FULL_ACC = re.compile(r"full_acc_(\d+)")


def estimate_tau(metrics: dict[str, float]) -> float | None:
    """1 + the sum of full_acc_<t> over the TTT steps in `metrics` (None when there are none)."""
    accs = [float(v) for k, v in metrics.items() if _FULL_ACC.fullmatch(k)]
    if not accs:
        return None
    return round(1.0 + sum(min(1.0, max(0.0, a)) for a in accs), 4)


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
