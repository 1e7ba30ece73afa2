"""What a sync leaves out: gitignore rules (.gitignore, .harnessignore), the config's excludes,
and the names that are never synced (.git, .harness, the runs pulled from the box)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from harness.sync.paths import NEVER_SYNCED, PULLED_RUNS

IGNORE_FILES = (".gitignore", ".harnessignore")  # later files win within one directory


class IgnoreRules:
    """gitignore semantics over a stack of ignore files (one per directory) plus config excludes.

    A path is judged by the deepest ignore file with a matching pattern (its last matching
    pattern decides, `!` re-includes); config excludes (relative to the project root) are applied
    first and win. Directories that are ignored are pruned, so nothing below them can be
    re-included: git behaves the same way.
    """

    def __init__(self, exclude: Sequence[str] = ()):
        self._exclude = self._spec(list(exclude)) if exclude else None
        self._by_dir: dict[str, object | None] = {}
        self._chains: dict[str, list[tuple[int, object]]] = {}

    @staticmethod
    def _spec(lines: list[str]):
        from pathspec import GitIgnoreSpec  # only when there is a pattern to match

        return GitIgnoreSpec.from_lines(lines)

    def _spec_for(self, root: Path, rel_dir: str):
        if rel_dir not in self._by_dir:
            lines: list[str] = []
            for name in IGNORE_FILES:
                f = root / rel_dir / name if rel_dir else root / name
                try:
                    lines += f.read_text(encoding="utf-8", errors="replace").splitlines()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    pass
            self._by_dir[rel_dir] = self._spec(lines) if lines else None
        return self._by_dir[rel_dir]

    def _chain(self, root: Path, parent: str) -> list[tuple[int, object]]:
        """(depth, spec) of the ignore files with patterns from `parent` up to the root, deepest
        first; once per directory, not per file."""
        chain = self._chains.get(parent)
        if chain is None:
            parts = parent.split("/") if parent else []
            specs = ((depth, self._spec_for(root, "/".join(parts[:depth]))) for depth in range(len(parts), -1, -1))
            chain = self._chains[parent] = [(depth, spec) for depth, spec in specs if spec is not None]
        return chain

    def ignored(self, root: Path, rel: str, is_dir: bool) -> bool:
        parent, _, name = rel.rpartition("/")
        if name in NEVER_SYNCED or rel == PULLED_RUNS:
            return True
        probe = rel + "/" if is_dir else rel
        if self._exclude is not None and self._exclude.match_file(probe):
            return True
        chain = self._chain(root, parent)
        parts = rel.split("/") if chain else []
        # deepest directory first: the first ignore file with an opinion decides
        for depth, spec in chain:
            sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
            decision = spec.check_file(sub).include
            if decision is not None:
                return bool(decision)
        return False
