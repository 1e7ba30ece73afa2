"""`harness sync`: push the project's code (SyncConfig.paths) to <workdir> on a host, incrementally.

Only what changed moves. The host keeps a manifest of what sync put there
(<workdir>/.harness/sync-manifest.json). A sync starts ONE helper process on the host
(host_helpers/sync_apply.py, by harness.helpers.start), which sends that manifest back while the
local tree is scanned; the entries that differ then go over the same process as one stream. A
no-op sync costs one remote exec and writes nothing on the host. Regular files and symlinks (as
links) go; `.git`, ignored files and links out of the tree do not. Deletions touch only paths the
manifest lists, under the current sync paths: outputs sync did not write are never touched.

Run records use `host_manifest_digest(transport, workdir)`: the digest of the code a run used.
How it decides, sends and deletes: docs/ARCHITECTURE.md, "harness sync, step by step".
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from harness import helpers
from harness.host_helpers import wire
from harness.transport.remote_shell import sh_expand_home
from harness.errors import HarnessError, UsageError
from harness.transport.base import Transport
from harness.transport.process import RemoteProcess

if TYPE_CHECKING:
    from harness.config import Config

MANIFEST_PATH = wire.MANIFEST_PATH  # relative to the host's workdir
LOCAL_CACHE_PATH = ".harness/sync-cache.json"  # relative to the project root (laptop)
IGNORE_FILES = (".gitignore", ".harnessignore")  # later files win within one directory
NEVER_SYNCED = {".git", ".harness"}
PULLED_RUNS = "runs"  # where `harness pull` lands runs, at the project's root: what came from the box never goes back
_HASH_BLOCK = 1 << 20


class SyncError(HarnessError):
    """The host refused part of a sync (the message lists what and why)."""


def shown_path(path: str) -> str:
    """A file name as a line shows it: as it is when printable, else quoted with its escapes (a
    newline in a name must not start a line of its own that reads as harness's)."""
    return path if path.isprintable() else repr(path)


@dataclass(frozen=True)
class Entry:
    """One synced path as recorded in the manifest."""

    kind: str  # "file" or "link"
    size: int
    mode: int  # permission bits (0 for links)
    sha256: str  # of the content; of the target text for links
    target: str = ""  # link target, as written

    def to_json(self) -> dict:
        return {"kind": self.kind, "size": self.size, "mode": self.mode, "sha256": self.sha256, "target": self.target}

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        return cls(str(d["kind"]), int(d["size"]), int(d["mode"]), str(d["sha256"]), str(d.get("target", "")))


UNKNOWN = ""  # sha256 of a file not read yet (a lazy scan): hashed when compared or sent


@dataclass
class LocalTree:
    entries: dict[str, Entry]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    files_hashed: int = 0  # files read to hash them (not served from the cache, not streamed)
    cache: "_HashCache | None" = None
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


@dataclass
class SyncPlan:
    roots: list[str]
    upload: list[str]  # paths to send, sorted
    delete: list[str]  # paths to remove on the host, sorted
    manifest: dict[str, Entry]  # the host manifest after this sync
    local: LocalTree
    ignored_manifest_entries: list[str] = field(default_factory=list)

    @cached_property
    def upload_bytes(self) -> int:  # cached: progress bars ask for it per file
        return sum(self.local.entries[p].size for p in self.upload if self.local.entries[p].kind == "file")

    @property
    def is_noop(self) -> bool:
        return not self.upload and not self.delete


@dataclass
class SyncResult:
    plan: SyncPlan
    dry_run: bool
    files_sent: int = 0
    bytes_sent: int = 0
    deleted: int = 0
    manifest_digest: str = ""
    refused: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class SyncOutcome:
    """`harness sync` on a host or a group (harness.host: Host.sync, Group.sync): each host's
    SyncResult, in the place's host order; `errors[host]` says why a host of a group failed (a
    host alone raises instead)."""

    where: str
    hosts: list[str]
    results: dict[str, SyncResult]
    errors: dict[str, str] = field(default_factory=dict)

    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self, dry_run: bool) -> dict[str, Any]:
        """`harness sync --json`: per host, what moved (dry_run: what would), or its error."""
        def one(h: str) -> dict[str, Any]:
            if h in self.errors:
                return {"error": self.errors[h]}
            r = self.results[h]
            plan = r.plan
            return {"upload": list(plan.upload), "delete": list(plan.delete), "upload_bytes": plan.upload_bytes,
                    "unchanged": len(plan.local.entries) - len(plan.upload), "files_sent": r.files_sent, "bytes_sent": r.bytes_sent,
                    "deleted": r.deleted, "manifest_digest": r.manifest_digest or None,
                    "skipped": [{"name": n, "why": w} for n, w in plan.local.skipped]}
        return {"where": self.where, "dry_run": dry_run, "ok": not self.errors, "hosts": {h: one(h) for h in self.hosts}}


# -------------------------------------------------------------------------------------------------
# Ignore rules


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


# -------------------------------------------------------------------------------------------------
# Local scan


def _clean_rel(path: str) -> str | None:
    """A normalized relative POSIX path without `..` (wire.clean_rel), and no `\\` (a Windows
    separator, never a name of ours: the host's apply refuses it too), or None."""
    return None if "\\" in path else wire.clean_rel(path)


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def normalize_roots(paths: Sequence[str]) -> list[str]:
    roots = []
    for p in paths:
        norm = PurePosixPath(p.replace(os.sep, "/")).as_posix().strip("/")
        if norm in ("", ".") or _clean_rel(norm) is None or norm.split("/")[0] in NEVER_SYNCED:
            raise UsageError(f"sync path {p!r} must be a path inside the project (not '.', '..' or .git)")
        roots.append(norm)
    # a root inside another root is already covered
    return sorted({r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots)})


class _HashCache:
    """(size, mtime_ns, inode) -> sha256, persisted next to the project so re-scans read nothing."""

    def __init__(self, path: Path | None, root: Path):
        self.path, self.root = path, root
        self.old: dict[str, list] = {}
        self.new: dict[str, list] = {}
        if path is not None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and data.get("version") == 1:
                    self.old = data.get("files", {})
            except (OSError, ValueError):
                pass

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        hit = self.old.get(rel)
        if hit and hit[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]:
            return hit[3]
        return None

    def store(self, rel: str, st: os.stat_result, digest: str) -> None:
        self.new[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]

    def save(self) -> None:
        if self.path is None or self.new == self.old:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}-{threading.get_ident()}")  # group syncs save from threads
        tmp.write_text(json.dumps({"version": 1, "files": self.new}, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, self.path)
        self.old = dict(self.new)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a local file, read in blocks (sync's scan and pull's verification)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_BLOCK):
            h.update(chunk)
    return h.hexdigest()


def _link_stays_inside(rel: str, target: str, roots: Sequence[str]) -> bool:
    if not target or target.startswith("/"):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target)).replace(os.sep, "/")
    return _clean_rel(resolved) is not None and _under(resolved, roots)


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
    cache = _HashCache(cache_file, root)
    tree = LocalTree(entries={}, cache=cache)

    def add(rel: str, full: str, st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(full)
            if not _link_stays_inside(rel, target, roots):
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


# -------------------------------------------------------------------------------------------------
# The host manifest


def manifest_digest(files: dict[str, Entry]) -> str:
    """sha256 of the canonical file table: equal digests, equal synced code."""
    table = {p: e.to_json() for p, e in files.items()}
    canonical = json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_manifest(raw: bytes) -> tuple[dict[str, Entry], str | None]:
    """(files, digest) from manifest bytes. An unreadable manifest owns nothing: the sync then
    re-sends everything and deletes nothing."""
    if not raw:
        return {}, None
    try:
        doc = json.loads(raw)
        return {str(p): Entry.from_json(e) for p, e in doc.get("files", {}).items()}, doc.get("digest")
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, None


def read_host_manifest(transport: Transport, workdir: str) -> tuple[dict[str, Entry], str | None]:
    """(files, digest) of the host manifest; ({}, None) when the host was never synced.

    Read through transport.stream (for SSH hosts over the persistent master connection): a no-op
    sync costs one multiplexed exec, no new SSH handshake. `~` in workdir is expanded by the host's shell."""
    argv = ["sh", "-c", f'm=$1; {sh_expand_home("m")}; [ -e "$m" ] || exit 3; exec cat -- "$m"', "sh", _manifest_path(workdir)]
    proc = transport.stream(argv, stdin=False)
    code, out = proc.communicate()
    if code == 3:
        return {}, None
    if code != 0:
        raise proc.error(f"read {MANIFEST_PATH} on {transport.name}")
    return parse_manifest(out)


def host_manifest_digest(transport: Transport, workdir: str) -> str | None:
    """Digest of the code last synced to this host (for run records); None if never synced."""
    return read_host_manifest(transport, workdir)[1]


# -------------------------------------------------------------------------------------------------
# Plan and apply


def plan_sync(local: LocalTree, host: dict[str, Entry], roots: Sequence[str]) -> SyncPlan:
    roots = list(roots)
    upload = sorted(p for p, e in local.entries.items() if host.get(p) != e)
    delete: list[str] = []
    manifest: dict[str, Entry] = dict(local.entries)
    ignored: list[str] = []
    for path, entry in host.items():
        if _clean_rel(path) is None or path.split("/")[0] in NEVER_SYNCED:
            ignored.append(path)
            continue
        if path in local.entries:
            continue
        if _under(path, roots):
            delete.append(path)
        else:
            manifest[path] = entry  # synced earlier from a path no longer configured: left alone
    return SyncPlan(roots, upload, sorted(delete), manifest, local, sorted(ignored))


ProgressCallback = Callable[[int, int], None]  # (files sent so far, bytes sent so far)


# The body after the header line (harness/host_helpers/sync_apply.py reads it): one record per file
# to send, in the header's order: size and permission bits, the content, its raw SHA-256 (hashed
# as it was read: what the host holds, whatever happened to the file meanwhile). Then one JSON
# line, {"digest": ...} of the resulting manifest. Links travel in the header alone.
RECORD = wire.SYNC_RECORD
GONE = wire.SYNC_GONE  # record size of a file that vanished (or became unreadable) since the scan
_FLUSH = 1 << 20
_PROGRESS_EVERY_S = 0.05


class _Framer:
    """Buffers small records into large pipe writes (5,000 small files: 5 writes, not 15,000)."""

    def __init__(self, raw):
        self.raw, self.buffer = raw, bytearray()

    def write(self, data) -> None:
        self.buffer += data
        if len(self.buffer) >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.raw.write(self.buffer)
            self.buffer.clear()
        self.raw.flush()


SYNC_APPLY = "sync_apply.py"


def _start_session(transport: Transport, python: str, workdir: str) -> RemoteProcess:
    """The apply helper (harness.helpers.start: its source and request {"workdir"} on stdin),
    run after a `cat` of the manifest (then a NUL): the manifest is on its way at once and the
    laptop plans while the interpreter starts. `~` in workdir is expanded on the host (by the
    shell for the manifest, by the helper)."""
    cat_manifest = f'm=$1; {sh_expand_home("m")}; ' + 'if [ -f "$m" ]; then cat -- "$m" || exit 2; fi; printf "\\000"; shift; exec "$@"'
    return helpers.start(transport, SYNC_APPLY, {"workdir": workdir}, python=python, before=["sh", "-c", cat_manifest, "sh", _manifest_path(workdir)])


def _manifest_path(workdir: str) -> str:
    """The manifest's path as configured (a leading ~ is expanded by the host's shell)."""
    return workdir.rstrip("/") + "/" + MANIFEST_PATH if workdir != "~" else "~/" + MANIFEST_PATH


class PreparedSync:
    """A planned sync holding its one exec on the host (harness/host_helpers/sync_apply.py).

    The helper starts first and sends the host manifest; the local scan runs meanwhile; the plan
    is then either applied over the same exec (`apply`) or dropped (`close`: the helper exits
    without touching anything). A sync therefore costs one remote process, a no-op included.
    The scan is lazy: a file the hash cache does not know is read only to compare it with a host
    entry of the same size and mode; any other file is sent and hashed while it streams (a first
    sync reads each file once). Use as a context manager."""

    def __init__(self, transport: Transport, root: Path, paths: Sequence[str], workdir: str, *, exclude: Sequence[str] = (), python: str = "python3", cache_file: Path | None = None):
        self.transport, self.root, self.workdir = transport, Path(root), workdir
        roots = normalize_roots(paths)
        self._proc = _start_session(transport, python, workdir)
        self._pending_out = b""
        self._done = False
        try:
            local = scan_local(self.root, roots, exclude, cache_file=cache_file if cache_file is not None else self.root / LOCAL_CACHE_PATH, hash_files=False)
            self._host, _ = parse_manifest(self._read_manifest())
            local.hash_unknown(self._host)
            if local.files_hashed:
                local.cache.save()  # kept even if the plan is dropped (a dry run, a group's preview)
            self.plan = plan_sync(local, self._host, roots)
        except BaseException:
            self.close()
            raise

    def _read_manifest(self) -> bytes:
        """The manifest bytes, up to the NUL that ends them (JSON never contains a raw NUL)."""
        buffer = b""
        fd = self._proc.stdout.fileno()
        while b"\0" not in buffer:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._fail("read the host manifest")
            buffer += chunk
        raw, _, self._pending_out = buffer.partition(b"\0")
        return raw

    def _fail(self, what: str) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        raise self._proc.error(f"sync helper on {self.transport.name} ({what})")

    def dry_run(self) -> SyncResult:
        """The plan with every hash known (the digest the sync would record); changes nothing."""
        self.plan.local.hash_unknown()
        self.plan.local.cache.save()
        self.plan = plan_sync(self.plan.local, self._host, self.plan.roots)
        return SyncResult(plan=self.plan, dry_run=True, manifest_digest=manifest_digest(self.plan.manifest))

    def _send_file(self, out: _Framer, rel: str, on_bytes: Callable[[int], None]) -> Entry | None:
        """One record: the file as it is now, hashed as it streams (None: it is gone; a GONE
        record went instead). A file that shrank meanwhile is padded with zeros to the size
        announced: the hash says so, and the next sync sends it again."""
        tree = self.plan.local
        try:
            fd = os.open(os.path.join(self.root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            out.write(RECORD.pack(GONE, 0))
            tree.skipped.append((rel, f"cannot read: {e.strerror}"))
            return None
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            out.write(RECORD.pack(st.st_size, mode))
            h, left, complete = hashlib.sha256(), st.st_size, True
            while left:
                chunk = os.read(fd, min(left, _HASH_BLOCK))
                if not chunk:
                    chunk, complete = bytes(min(left, _HASH_BLOCK)), False
                h.update(chunk)
                out.write(chunk)
                left -= len(chunk)
                if st.st_size > _FLUSH:
                    on_bytes(len(chunk))
            if st.st_size <= _FLUSH:
                on_bytes(st.st_size)
            out.write(h.digest())
            after = os.fstat(fd)
        finally:
            os.close(fd)
        entry = Entry("file", st.st_size, mode, h.hexdigest())
        if complete and (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            tree.cache.store(rel, st, entry.sha256)  # what was hashed is what the file holds
        return entry

    def apply(self, progress: ProgressCallback | None = None) -> SyncResult:
        """Carry out the plan; raises SyncError if the host refused any path."""
        plan = self.plan
        if plan.is_noop:
            self.close()
            plan.local.cache.save()
            return SyncResult(plan=plan, dry_run=False, manifest_digest=manifest_digest(plan.manifest))
        result = SyncResult(plan=plan, dry_run=False)
        header = {
            "roots": plan.roots,
            "upload": {p: plan.local.entries[p].to_json() for p in plan.upload},
            "delete": plan.delete,
            "drop": plan.ignored_manifest_entries,
        }
        sent = {"files": 0, "bytes": 0, "shown": 0.0}

        def on_bytes(n: int) -> None:
            sent["bytes"] += n
            if progress and time.monotonic() - sent["shown"] >= _PROGRESS_EVERY_S:  # not per small file
                sent["shown"] = time.monotonic()
                progress(sent["files"], sent["bytes"])

        proc = self._proc
        try:
            stream = _Framer(proc.stdin)
            stream.write(json.dumps(header, ensure_ascii=True).encode() + b"\n")
            for rel in plan.upload:
                if plan.local.entries[rel].kind == "file":
                    entry = self._send_file(stream, rel, on_bytes)
                    if entry is None:  # gone since the scan: the host keeps what it had
                        del plan.local.entries[rel]
                        plan.manifest.pop(rel)
                        if rel in self._host:
                            plan.manifest[rel] = self._host[rel]
                    else:
                        plan.local.entries[rel] = plan.manifest[rel] = entry
                sent["files"] += 1
            result.manifest_digest = manifest_digest(plan.manifest)
            stream.write(json.dumps({"digest": result.manifest_digest}).encode() + b"\n")
            stream.flush()
            if progress:
                progress(sent["files"], sent["bytes"])
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the helper died: its stderr says why
        plan.local.cache.save()
        out = self._pending_out + proc.stdout.read()
        code = proc.wait()
        self._done = True
        if code != 0 or not out.strip():
            raise proc.error("sync helper on " + self.transport.name)
        report = json.loads(out.decode().strip().splitlines()[-1])
        result.files_sent = report["written"]
        result.bytes_sent = sent["bytes"]
        result.deleted = report["deleted"]
        result.refused = [tuple(r) for r in report["refused"]]
        if result.refused:
            listed = "; ".join(f"{shown_path(p)}: {shown_path(why)}" for p, why in result.refused[:5])
            more = f" (and {len(result.refused) - 5} more)" if len(result.refused) > 5 else ""
            raise SyncError(f"the host refused {len(result.refused)} path(s): {listed}{more}")
        return result

    def close(self) -> None:
        """Let the helper go without changing anything (EOF before a header)."""
        if self._done:
            return
        self._done = True
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        # The helper changes nothing before it has a header, so there is nothing to wait for:
        # end our side now (the host side sees the channel close and exits).
        self._proc.stop()

    def __enter__(self) -> "PreparedSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prepare_sync(transport: Transport, root: Path, paths: Sequence[str], workdir: str, *, exclude: Sequence[str] = (), python: str = "python3", cache_file: Path | None = None) -> SyncPlan:
    """The plan alone (the helper exits without touching anything)."""
    with PreparedSync(transport, root, paths, workdir, exclude=exclude, python=python, cache_file=cache_file) as prepared:
        return prepared.plan


def sync(
    transport: Transport,
    root: Path,
    paths: Sequence[str],
    workdir: str,
    *,
    exclude: Sequence[str] = (),
    python: str = "python3",
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    cache_file: Path | None = None,
) -> SyncResult:
    """Push `paths` (relative to `root`) to `workdir` on the host (docs/ARCHITECTURE.md, "harness sync, step by step")."""
    with PreparedSync(transport, root, paths, workdir, exclude=exclude, python=python, cache_file=cache_file) as prepared:
        return prepared.dry_run() if dry_run else prepared.apply(progress)


def sync_hosts(config: "Config", transports: dict[str, Transport], paths: Sequence[str], *, workdirs: dict[str, str] | None = None,
               on_plan: Callable[[str, Any], None] | None = None, progress_for: Callable[[str], Callable[[int, int], None]] | None = None):
    """`harness sync GROUP`: plan every host in turn (PreparedSync: a local scan, cached, while
    the host sends its manifest; one thread touches the local hash cache), then apply the plans
    on all hosts at once, one transport each. [(host, SyncResult, error)]."""
    from harness.fanout import parallel

    hosts = list(transports)
    workdirs = workdirs or {h: config.host(h).workdir for h in hosts}
    prepared: dict[str, PreparedSync] = {}
    try:
        for h in hosts:
            prepared[h] = PreparedSync(transports[h], config.root, paths, workdirs[h], exclude=config.sync.exclude, python=config.host(h).python)
            if on_plan:
                on_plan(h, prepared[h].plan)
        return parallel(hosts, lambda h: prepared[h].apply(progress_for(h) if progress_for else None))
    finally:
        for p in prepared.values():
            p.close()
