"""The train stage's checkpoints: numbered epoch directories, and best.json naming the best one.

    CHECKPOINTS/<epoch>/           config.json, model.safetensors, optimizer state (speculators)
    CHECKPOINTS/best.json          {"checkpoint": "<epoch dir name>", "step": N, "tau": X}

best.json is written by the train stage (atomically) each time a checkpoint's estimated tau
(common/acceptance.py) is within 5% of the highest so far (train_draft.BEST_TAU_TOLERANCE: the
estimate is noisy, and the later checkpoint has trained longer); evaluate and export read it to use that checkpoint
instead of the last one, and `harness pull --best-checkpoint` fetches only the directory it names.
"checkpoint" is always a directory name directly under CHECKPOINTS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

BEST_FILE = "best.json"
WEIGHTS = "model.safetensors"


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was asked for."""


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / WEIGHTS).is_file()


def latest_checkpoint(output: Path) -> Path | None:
    """The highest numbered epoch checkpoint under `output` (symlinks such as checkpoint_best and
    epochN_end are speculators' aliases, not checkpoints of their own)."""
    if not output.is_dir():
        return None
    epochs = [d for d in output.iterdir() if d.name.isdigit() and d.is_dir() and not d.is_symlink() and is_checkpoint(d)]
    return max(epochs, key=lambda d: int(d.name)) if epochs else None


def read_best(output: Path) -> dict[str, Any] | None:
    """best.json when it names a checkpoint that exists under `output`, else None."""
    try:
        best = json.loads((output / BEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    name = best.get("checkpoint") if isinstance(best, dict) else None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        return None
    if not is_checkpoint(output / name) or not isinstance(best.get("tau"), (int, float)):
        return None
    return best


def write_best(output: Path, checkpoint: str, step: int, tau: float) -> None:
    record = {"checkpoint": checkpoint, "step": int(step), "tau": float(tau)}
    tmp = output / f".{BEST_FILE}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, output / BEST_FILE)


def resolve_draft(path: Path) -> tuple[Path, dict[str, Any] | None]:
    """A checkpoint directory as given, or from a training output the checkpoint best.json names
    (with its record), else the latest epoch's."""
    if is_checkpoint(path):
        return path, None
    best = read_best(path)
    if best is not None:
        return path / best["checkpoint"], best
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest, None
    raise CheckpointError(f"--draft {path}: no checkpoint (config.json and {WEIGHTS}, or numbered epoch directories holding them)")
