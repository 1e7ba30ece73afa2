"""The local tree: the sync paths walked under the project root, ignore rules applied, links out
of the tree and other odd files skipped with a reason, each file's hash from the cache or read
(or, in a lazy scan, left UNKNOWN until it is compared or sent)."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Sequence

from harness.sync.hashing import HashCache, sha256_file
from harness.sync.ignore import IgnoreRules
from harness.sync.manifest import Entry
from harness.sync.paths import clean_rel, normalize_roots, under

UNKNOWN = ""  # sha256 of a file not read yet (a lazy scan): hashed when compared or sent


@dataclass
class LocalTree:
    entries: dict[str, Entry]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    files_hashed: int = 0  # files read to hash them (not served from the cache, not streamed)
    cache: "HashCache | None" = None
    stats: dict[str, os.stat_result] = field(default_factory=dict)  # of files with UNKNOWN hashes

    def hash_file(self, rel: str) -> None:
        """Fill in one UNKNOWN hash (read the file now)."""
        st = self.stats.pop(rel)
        digest = sha256_file(self.cache.root / rel)
        self.files_hashed += 1
        self.cache.store(rel, st, digest)
        self.entries[rel] = Entry("file", st.st_size, stat.S_IMODE(st.st_mode), digest)

    def hash_unknown(self, host: dict[str, Entry] | None = None) -> None:
        """Hash the files whose hash is UNKNOWN; with `host`, only those that may equal the host's
        entry (same size and mode): a file the host lacks, or holds at another size, is sent
        anyway and hashed while it streams."""
        for rel in list(self.stats):
            entry, theirs = self.entries[rel], (host or {}).get(rel)
            if host is None or (theirs is not None and theirs.kind == "file" and (theirs.size, theirs.mode) == (entry.size, entry.mode)):
                self.hash_file(rel)


def link_stays_inside(rel: str, target: str, roots: Sequence[str]) -> bool:
    if not target or target.startswith("/"):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target)).replace(os.sep, "/")
    return clean_rel(resolved) is not None and under(resolved, roots)


def scan_local(
    root: Path,
    paths: Sequence[str],
    exclude: Sequence[str] = (),
    *,
    cache_file: Path | None = None,
    hash_files: bool = True,
) -> LocalTree:
    """Walk the sync paths under root, apply ignore rules, and hash what changed since last time.

    hash_files=False (a lazy scan): a file the cache does not know gets an UNKNOWN hash and is
    not read here (LocalTree.hash_unknown, or hashed while it streams); the caller then saves
    the cache (tree.cache.save()) once the hashes are known."""
    root = Path(root)
    roots = normalize_roots(paths)
    rules = IgnoreRules(exclude)
    cache = HashCache(cache_file, root)
    tree = LocalTree(entries={}, cache=cache)

    def add(rel: str, full: str, st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(full)
            if not link_stays_inside(rel, target, roots):
                tree.skipped.append((rel, f"symlink to {target!r} leads outside the synced tree"))
                return
            digest = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()
            tree.entries[rel] = Entry("link", len(target), 0, digest, target)
        elif stat.S_ISREG(st.st_mode):
            digest = cache.lookup(rel, st)
            if digest is None:
                tree.stats[rel] = st
                tree.entries[rel] = Entry("file", st.st_size, stat.S_IMODE(st.st_mode), UNKNOWN)
                if hash_files:
                    tree.hash_file(rel)
                return
            cache.store(rel, st, digest)
            tree.entries[rel] = Entry("file", st.st_size, stat.S_IMODE(st.st_mode), digest)
        else:
            tree.skipped.append((rel, "not a regular file, directory or symlink"))

    def walk(rel_dir: str) -> None:
        try:
            with os.scandir(root / rel_dir) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as e:
            tree.skipped.append((rel_dir, f"cannot read directory: {e.strerror}"))
            return
        for child in children:
            rel = f"{rel_dir}/{child.name}"
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                tree.skipped.append((rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), "name is not valid UTF-8"))
                continue
            is_dir = child.is_dir(follow_symlinks=False)
            if rules.ignored(root, rel, is_dir):
                continue
            if is_dir:
                walk(rel)
            else:
                add(rel, child.path, child.stat(follow_symlinks=False))

    for r in roots:
        full = root / r
        try:
            st = full.lstat()
        except FileNotFoundError:
            tree.skipped.append((r, "sync path does not exist"))
            continue
        # ignore files between the project root and this sync path apply too
        parent = str(PurePosixPath(r).parent)
        if parent != "." and rules.ignored(root, parent, True):
            continue
        if stat.S_ISDIR(st.st_mode):
            if not rules.ignored(root, r, True):
                walk(r)
        elif not rules.ignored(root, r, False):
            add(r, str(full), st)
    if hash_files:
        cache.save()
    return tree
