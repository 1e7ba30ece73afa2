"""Which listed entries a pull takes: --include/--exclude (gitignore-style, on the path relative to
REMOTE_PATH) and --latest-checkpoint (the newest speculators epoch directory of each checkpoint
root, plus run records and logs)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.pull.options import PullOptions
from harness.pull.paths import inside

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

# Run records and logs kept by --latest-checkpoint (see harness/jobs.py for the run layout).
RECORD_PATTERNS = ["run.yaml", "run.json", "spec.json", "log", "*.log", "*.jsonl", "*.txt", "exit*", "status*"]
CHECKPOINT_DIR = re.compile(r"^\d+$")  # speculators names epoch checkpoints <save_path>/<epoch>/


@dataclass(frozen=True)
class RemoteEntry:
    rel: str
    kind: str  # file | link | dir | other
    size: int
    mode: int
    mtime_ns: int
    target: str = ""


def select(entries: list[RemoteEntry], options: PullOptions) -> list[RemoteEntry]:
    """Apply --include/--exclude and --latest-checkpoint. Directories are never selected."""
    chosen = [e for e in entries if e.kind != "dir"]
    if options.latest_checkpoint:
        chosen = _latest_checkpoint_only(entries, chosen)
    if options.include:
        spec = _patterns(options.include)
        chosen = [e for e in chosen if spec.match_file(e.rel)]
    if options.exclude:
        spec = _patterns(options.exclude)
        chosen = [e for e in chosen if not spec.match_file(e.rel)]
    return chosen


def _patterns(lines) -> "GitIgnoreSpec":
    from pathspec import GitIgnoreSpec  # here: a pull without patterns waits for no import

    return GitIgnoreSpec.from_lines(list(lines))


def _latest_checkpoint_only(entries: list[RemoteEntry], chosen: list[RemoteEntry]) -> list[RemoteEntry]:
    # speculators saves epoch N to <save_path>/<N>/ (plain directories; links such as
    # checkpoint_best point at one of them): keep the highest N of each save_path.
    newest: dict[str, int] = {}
    for e in entries:
        if e.kind == "dir" and CHECKPOINT_DIR.match(os.path.basename(e.rel)):
            parent, epoch = os.path.dirname(e.rel), int(os.path.basename(e.rel))
            newest[parent] = max(newest.get(parent, -1), epoch)
    keep_dirs = {(f"{p}/{n}" if p else str(n)) for p, n in newest.items()}
    records = _patterns(RECORD_PATTERNS)
    kept = []
    for e in chosen:
        in_checkpoint = any(inside(e.rel, d) and e.rel != d for d in keep_dirs)
        link_to_kept = e.kind == "link" and os.path.normpath(os.path.join(os.path.dirname(e.rel), e.target)) in keep_dirs
        if in_checkpoint or link_to_kept or records.match_file(e.rel):
            kept.append(e)
    return kept
