"""`harness pull`: fetch files from a host: selective, resumable, verified, atomic, parallel.

One pull, step by step
  1. list   one remote command (harness/remote/pull_helper.py `list`) returns every entry under
            REMOTE_PATH as JSON (names never parsed from shell output; links reported, not
            followed).
  2. select --include/--exclude (gitignore-style patterns on the path relative to REMOTE_PATH),
            --latest-checkpoint (only the newest speculators epoch directory `<ckpt root>/<N>/` of
            each checkpoint root, plus run records and logs).
  3. check  every name must land inside LOCAL_DIR: absolute names, `..`, a local parent that is a
            link leading out, a remote link whose target leads out: refused and reported, nothing
            written for them.
  4. hash   one remote command hashes every selected file (SHA-256 on the host), concurrently
            with the download.
  5. fetch  each file is cut into pieces (PullOptions.piece_size), queued in file order; each
            stream (a long-lived helper in `send` mode, through OpenSSH) takes the next piece as
            it finishes one. The first stream starts while the listing runs, over its own
            connection for a big pull (the ControlMaster relay costs a copy) or the shared one.
            Its first request times the link: on a long round trip (where one stream is capped
            by its channel window) streams are added, each on its own connection, while they
            raise throughput, up to `jobs`; on a short one a single stream is fastest (CPU-bound).
            Bytes land in `.NAME.harness-part` next to the
            target; `.NAME.harness-part.json` records the remote (size, mtime_ns) they copy and
            `.NAME.harness-part.done` how many bytes of each piece are in (after every write).
  6. verify a local hasher follows the contiguous received prefix, so the local SHA-256 is ready
            moments after the last byte; it must equal the host's hash (taken from a file that
            did not change while hashed). Only then is the part renamed to its final name.
            A mismatch or a file changed on the host is retried (fresh listing, fresh hash), then
            reported as failed; its bytes are never kept.

Resuming: a killed pull (Ctrl-C, kill -9, dropped link) leaves the part files; the next pull
continues each piece from the bytes recorded, as long as the host file's (size, mtime_ns) still
match. Files whose local copy already has the host's SHA-256 are skipped.

Where files land: a remote directory's entries go to LOCAL_DIR/<path relative to REMOTE_PATH>; a
remote file goes to LOCAL_DIR/<its name>.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import queue
import re
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.errors import HarnessError, UsageError
from harness.sync import sha256_file
from harness.transport.base import Transport
from harness.transport.openssh import bulk_failure

PART_SUFFIX = ".harness-part"
MiB = 1 << 20
# Run records and logs kept by --latest-checkpoint (see harness/jobs.py for the run layout).
RECORD_PATTERNS = ["run.yaml", "run.json", "spec.json", "log", "*.log", "*.jsonl", "*.txt", "exit*", "status*"]
_CHECKPOINT_DIR = re.compile(r"^\d+$")  # speculators names epoch checkpoints <save_path>/<epoch>/
_FRAME_HEADER = struct.Struct(">BQ")
_COUNTERS = struct.Struct("<Q")
_SPLICE = hasattr(os, "splice")  # Linux: stream bytes go pipe -> file without passing through Python
ADD_INTERVAL_S = 0.5  # how often _fetch_all considers adding a stream
ADD_GAIN = 1.25  # ... and the rate gain the previous doubling must have brought
FIRST_STEP_STREAMS = 4
BIG_PULL_BYTES = 256 * MiB
OWN_CONNECTION_FROM_BYTES = 64 * MiB  # the first stream too gets its own connection
LONG_LINK_RTT_S = 0.015  # below: loopback/LAN, one stream (CPU-bound); above: window-bound streams
HOST_HASHING_FAILED = "host hashing failed"  # the hash command itself failed (not one file)


@dataclass(frozen=True)
class PullOptions:
    include: tuple[str, ...] = ()  # gitignore-style; empty = everything
    exclude: tuple[str, ...] = ()
    latest_checkpoint: bool = False  # newest <ckpt root>/<epoch>/ only, plus run records and logs
    jobs: int = 8  # most parallel OpenSSH streams (each beyond the first on its own connection)
    adaptive: bool = True  # add streams one by one while they raise throughput; False: all at once
    piece_size: int = 16 * MiB  # unit of parallelism and of resume bookkeeping
    retries: int = 2  # extra attempts for a file that failed verification or changed on the host
    stream_retries: int = 3  # reconnects of one stream after a dropped link, within one attempt
    python: str = "python3"  # interpreter on the host for the helper
    dry_run: bool = False


@dataclass(frozen=True)
class RemoteEntry:
    rel: str
    kind: str  # file | link | dir | other
    size: int
    mode: int
    mtime_ns: int
    target: str = ""


@dataclass
class PullReport:
    remote_root: str = ""
    local_dir: str = ""
    fetched: list[str] = field(default_factory=list)
    identical: list[str] = field(default_factory=list)  # already present with the same SHA-256
    links: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (name, why) - unsafe names
    failed: list[tuple[str, str]] = field(default_factory=list)  # (name, why) - not fetched/verified
    planned: list[str] = field(default_factory=list)  # dry run: what would be fetched
    bytes_received: int = 0  # over the wire, this invocation
    bytes_resumed: int = 0  # already on disk from an interrupted pull
    streams: int = 0  # most parallel streams used
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.refused and not self.failed


class PullProgress:
    """Hooks the CLI turns into a progress bar; every method may be called from worker threads."""

    def start(self, files: int, total_bytes: int, done_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file_done(self, rel: str) -> None: ...


# -------------------------------------------------------------------------------------------------
# Names: what may land where


def clean_rel(name: str) -> str | None:
    """name when it is a plain relative path (no `..`, not absolute, valid UTF-8), else None."""
    if not name or "\0" in name or name.startswith("/"):
        return None
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return None
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return name


def part_paths(target: Path) -> tuple[Path, Path, Path]:
    """(bytes, identity, counters) files of a pull in progress for target."""
    base = f".{target.name}{PART_SUFFIX}"
    return target.with_name(base), target.with_name(base + ".json"), target.with_name(base + ".done")


def received_bytes(target: Path) -> int:
    """Bytes of target already received by an unfinished pull (0 if none): for progress
    displays, tests and benches."""
    try:
        raw = part_paths(Path(target))[2].read_bytes()
    except OSError:
        return 0
    return sum(_COUNTERS.unpack_from(raw, i)[0] for i in range(0, len(raw) - len(raw) % 8, 8))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def safe_parent(local_root: Path, rel: str) -> Path:
    """Create rel's parent directories under local_root, refusing any existing component that is
    a link leading out of local_root or is not a directory. Returns the parent."""
    root = os.path.realpath(local_root)
    current = root
    for part in rel.split("/")[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            resolved = os.path.realpath(current)
            if not _inside(resolved, root):
                raise _Unsafe(f"local {os.path.relpath(current, root)} is a link leading out of {local_root}")
            current = resolved
        if not os.path.exists(current):
            os.mkdir(current)
        elif not os.path.isdir(current):
            raise _Unsafe(f"local {os.path.relpath(current, root)} is not a directory")
    return Path(current)


class _Unsafe(Exception):
    pass


def link_target_ok(rel: str, target: str) -> bool:
    if not target or target.startswith("/"):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return clean_rel(resolved) is not None


# -------------------------------------------------------------------------------------------------
# Remote helper calls


def _helper_source() -> str:
    return (Path(__file__).parent / "remote" / "pull_helper.py").read_text(encoding="utf-8")


def helper_argv(python: str, mode: str, root: str) -> list[str]:
    # -S: the helper is stdlib only; skipping site (and its .pth files) saves most of the start-up
    return [python, "-S", "-c", _helper_source(), mode, root]


def run_bulk(transport: Transport, argv: list[str], stdin: bytes = b"", stdout=None) -> tuple[int, bytes, bytes]:
    """Run argv on the host through transport.local_argv (OpenSSH with a persistent ControlMaster
    for SSH hosts): no paramiko handshake, and a dropped link is re-established by the next call.
    stdout: None to capture, or a sink called with each chunk. Returns (exit code, stdout, stderr)."""
    proc = subprocess.Popen(transport.local_argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out: list[bytes] = []
    while chunk := proc.stdout.read(1 << 16):
        (stdout or out.append)(chunk)
    code = proc.wait()
    reader.join()
    return code, b"".join(out), b"".join(err)


def list_remote(transport: Transport, remote_path: str, python: str = "python3") -> tuple[str, bool, list[RemoteEntry]]:
    """(resolved root, is_dir, entries) of remote_path on the host (`~` is expanded there)."""
    code, out, err = run_bulk(transport, helper_argv(python, "list", remote_path))
    if code == 3:
        raise UsageError(f"{transport.name}:{remote_path}: {err.decode('utf-8', 'replace').strip()}")
    if code != 0:
        raise bulk_failure(transport.name, f"pull listing on {transport.name}", code, err.decode("utf-8", "replace"))
    doc = json.loads(out)
    entries = [RemoteEntry(str(e[0]), str(e[1]), int(e[2]), int(e[3]), int(e[4]), str(e[5])) for e in doc["entries"]]
    return doc["root"], bool(doc["is_dir"]), entries


def select(entries: list[RemoteEntry], options: PullOptions) -> list[RemoteEntry]:
    """Apply --include/--exclude and --latest-checkpoint. Directories are never selected."""
    from pathspec import GitIgnoreSpec

    chosen = [e for e in entries if e.kind != "dir"]
    if options.latest_checkpoint:
        chosen = _latest_checkpoint_only(entries, chosen)
    if options.include:
        spec = GitIgnoreSpec.from_lines(list(options.include))
        chosen = [e for e in chosen if spec.match_file(e.rel)]
    if options.exclude:
        spec = GitIgnoreSpec.from_lines(list(options.exclude))
        chosen = [e for e in chosen if not spec.match_file(e.rel)]
    return chosen


def _latest_checkpoint_only(entries: list[RemoteEntry], chosen: list[RemoteEntry]) -> list[RemoteEntry]:
    from pathspec import GitIgnoreSpec

    # speculators saves epoch N to <save_path>/<N>/ (plain directories; links such as
    # checkpoint_best point at one of them): keep the highest N of each save_path.
    newest: dict[str, int] = {}
    for e in entries:
        if e.kind == "dir" and _CHECKPOINT_DIR.match(os.path.basename(e.rel)):
            parent, epoch = os.path.dirname(e.rel), int(os.path.basename(e.rel))
            newest[parent] = max(newest.get(parent, -1), epoch)
    keep_dirs = {(f"{p}/{n}" if p else str(n)) for p, n in newest.items()}
    records = GitIgnoreSpec.from_lines(RECORD_PATTERNS)
    kept = []
    for e in chosen:
        in_checkpoint = any(_inside(e.rel, d) and e.rel != d for d in keep_dirs)
        link_to_kept = e.kind == "link" and os.path.normpath(os.path.join(os.path.dirname(e.rel), e.target)) in keep_dirs
        if in_checkpoint or link_to_kept or records.match_file(e.rel):
            kept.append(e)
    return kept


class _HashJob:
    """Host SHA-256 of every selected file, one remote command, results as they come."""

    def __init__(self, transport: Transport, root: str, rels: list[str], python: str):
        self.results: dict[str, tuple[str | None, int, int, str | None]] = {}
        self.error: str | None = None
        self._done = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(transport, root, rels, python), daemon=True)
        self._thread.start()

    def _run(self, transport, root, rels, python) -> None:
        buffer = bytearray()

        def sink(chunk: bytes) -> None:
            buffer.extend(chunk)
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                rel, digest, size, mtime_ns, err = json.loads(line)
                with self._cond:
                    self.results[rel] = (digest, size, mtime_ns, err)
                    self._cond.notify_all()

        try:
            if rels:
                code, _, err = run_bulk(transport, helper_argv(python, "hash", root), json.dumps(rels).encode(), sink)
                if code != 0:
                    self.error = f"{HOST_HASHING_FAILED} ({code}): {err.decode('utf-8', 'replace').strip()[-300:]}"
        except Exception as e:  # noqa: BLE001 - reported per file below
            self.error = f"{HOST_HASHING_FAILED}: {e}"
        finally:
            with self._cond:
                self._done.set()
                self._cond.notify_all()

    def get(self, rel: str) -> tuple[str | None, int, int, str | None]:
        with self._cond:
            while rel not in self.results and not self._done.is_set():
                self._cond.wait()
            return self.results.get(rel, (None, 0, 0, self.error or f"{HOST_HASHING_FAILED}: no result"))


# -------------------------------------------------------------------------------------------------
# Part files: what has arrived, persisted so a new process can resume


class _PartFile:
    """The bytes of one file in flight, and what is known about them, next to the target:
      .NAME.harness-part       the bytes, each at its offset (sparse until filled)
      .NAME.harness-part.json  what they are a copy of: remote (size, mtime_ns), piece size
      .NAME.harness-part.done  one 8-byte counter per piece: bytes of it already in, rewritten
                               in place (pwrite) after every write, so a killed pull loses at
                               most the bytes of its last few system calls."""

    def __init__(self, target: Path, entry: RemoteEntry, piece_size: int):
        self.target = target
        self.entry = entry
        self.part, self.meta, self.counters = part_paths(target)
        self.size = entry.size
        self.piece_size = piece_size
        n = max(1, -(-entry.size // piece_size))
        self.pieces = [(i * piece_size, min(entry.size, (i + 1) * piece_size)) for i in range(n)]
        self.done = [0] * n
        self.resumed_bytes = 0
        self._lock = threading.Lock()
        self._load_or_create()
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.ftruncate(self.fd, self.size)
        self.counters_fd = os.open(self.counters, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.pwrite(self.counters_fd, b"".join(_COUNTERS.pack(d) for d in self.done), 0)
        # hashing follows the contiguous prefix of complete pieces
        self.hasher = hashlib.sha256()
        self.hashed_pieces = 0
        self.local_sha256: str | None = None
        self.failed: str | None = None

    def _identity(self) -> dict:
        return {"size": self.entry.size, "mtime_ns": self.entry.mtime_ns, "piece_size": self.piece_size, "remote": self.entry.rel}

    def _load_or_create(self) -> None:
        try:
            meta = json.loads(self.meta.read_text())
            raw = self.counters.read_bytes()
            if meta == self._identity() and self.part.exists() and len(raw) == 8 * len(self.pieces):
                done = struct.unpack(f"<{len(self.pieces)}Q", raw)
                self.done = [min(d, end - start) for d, (start, end) in zip(done, self.pieces)]
                self.resumed_bytes = sum(self.done)
                return
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            pass
        # no usable record: start over (a stale part of another version is never reused)
        for p in (self.part, self.meta, self.counters):
            if p.exists() or p.is_symlink():
                p.unlink()
        tmp = self.meta.with_name(self.meta.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self._identity()))
        os.replace(tmp, self.meta)

    def _record(self, piece: int) -> None:
        """Persist one piece's counter (called after the bytes it counts were written)."""
        os.pwrite(self.counters_fd, _COUNTERS.pack(self.done[piece]), 8 * piece)

    def receive(self, piece: int, pipe_fd: int, length: int, on_bytes: Callable[[int], None]) -> int:
        """Move `length` bytes from the stream into this piece (zero-copy splice on Linux);
        returns how many arrived (fewer: the stream ended). The counter follows the bytes."""
        start, _ = self.pieces[piece]
        moved = 0
        while moved < length:
            offset = start + self.done[piece]
            if _SPLICE:
                k = os.splice(pipe_fd, self.fd, min(length - moved, 4 * MiB), offset_dst=offset)
            else:
                data = os.read(pipe_fd, min(length - moved, MiB))
                k = len(data)
                if k:
                    os.pwrite(self.fd, data, offset)
            if k == 0:
                break
            moved += k
            self.done[piece] += k  # each piece is written by one stream at a time
            self._record(piece)
            on_bytes(k)
        return moved

    def piece_complete(self, i: int) -> bool:
        start, end = self.pieces[i]
        return self.done[i] >= end - start

    @property
    def complete(self) -> bool:
        return all(self.piece_complete(i) for i in range(len(self.pieces)))

    def hash_ready_pieces(self) -> None:
        while self.hashed_pieces < len(self.pieces) and self.piece_complete(self.hashed_pieces):
            start, end = self.pieces[self.hashed_pieces]
            position = start
            while position < end:
                data = os.pread(self.fd, min(4 * MiB, end - position), position)
                if not data:
                    raise OSError(f"{self.part}: shorter than recorded")
                self.hasher.update(data)
                position += len(data)
            self.hashed_pieces += 1
        if self.hashed_pieces == len(self.pieces) and self.local_sha256 is None:
            self.local_sha256 = self.hasher.hexdigest()

    def _close_fds(self) -> None:
        for name in ("fd", "counters_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def finish(self, mode: int) -> None:
        """Verified: give the part its final name (the only way a file reaches it)."""
        os.fchmod(self.fd, mode & 0o777 or 0o644)
        self._close_fds()
        os.replace(self.part, self.target)
        self.meta.unlink(missing_ok=True)
        self.counters.unlink(missing_ok=True)

    def discard(self) -> None:
        self._close_fds()
        for p in (self.part, self.meta, self.counters):
            p.unlink(missing_ok=True)

    def close(self) -> None:
        """Keep everything for a later pull to resume."""
        self._close_fds()


# -------------------------------------------------------------------------------------------------
# Streams


@dataclass
class _Segment:
    part: _PartFile
    piece: int

    def request(self) -> list:
        start, end = self.part.pieces[self.piece]
        offset = start + self.part.done[self.piece]
        return [self.part.entry.rel, offset, end - offset, self.part.entry.size, self.part.entry.mtime_ns]

    @property
    def remaining(self) -> int:
        start, end = self.part.pieces[self.piece]
        return end - start - self.part.done[self.piece]


class _Hasher(threading.Thread):
    """Follows each file's contiguous complete prefix (reading back from the page cache)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.queue: queue.Queue[_PartFile | None] = queue.Queue()

    def run(self) -> None:
        while (part := self.queue.get()) is not None:
            try:
                if part.failed is None and part.fd >= 0:
                    part.hash_ready_pieces()
            except BaseException as e:  # noqa: BLE001
                part.failed = f"local read failed: {e}"


class _WorkQueue:
    """Segments in file order, handed to whichever stream asks next (so the contiguous prefix the
    hasher follows advances at the aggregate rate, and a faster stream simply takes more)."""

    def __init__(self, segments: list[_Segment]):
        self._items = collections.deque(segments)
        self._lock = threading.Lock()

    def take(self) -> _Segment | None:
        with self._lock:
            while self._items:
                seg = self._items.popleft()
                if seg.part.failed is None and seg.remaining > 0:
                    return seg
            return None

    def give_back(self, segments: list[_Segment]) -> None:
        with self._lock:
            self._items.extendleft(reversed(segments))

    def remaining_bytes(self) -> int:
        with self._lock:
            return sum(s.remaining for s in self._items)

    def drain(self) -> list[_Segment]:
        with self._lock:
            items, self._items = list(self._items), collections.deque()
            return items


def _read_exact(stream, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def start_send_helper(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    _widen_pipe(proc.stdout.fileno())
    return proc


def _widen_pipe(fd: int) -> None:
    """Linux: a 1 MiB pipe lets one splice() move up to 1 MiB instead of 64 KiB (16x fewer
    system calls and Python round trips per GiB). Harmless where unsupported."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), MiB)
    except (ImportError, OSError):
        pass


class _Stream(threading.Thread):
    """One long-lived helper (`send` mode) on the host, fed segment requests one line at a time
    (REQUESTS_IN_FLIGHT ahead, so there is no idle round trip between segments). A dropped
    stream returns its unfinished segments to the queue and reconnects, up to stream_retries."""

    REQUESTS_IN_FLIGHT = 2

    def __init__(self, argv: list[str], root: str, work: _WorkQueue, options: PullOptions, hasher: _Hasher, on_bytes: Callable[[int], None], proc: subprocess.Popen | None = None):
        super().__init__(daemon=True)
        self.argv, self.root, self.work, self.options, self.hasher, self.on_bytes = argv, root, work, options, hasher, on_bytes
        self.proc = proc  # already started (its connection set up while the listing ran)
        self.gave_up: str | None = None
        self.receiving = threading.Event()  # set at the first byte
        self.round_trip_s: float | None = None  # first request -> first answer

        def on_bytes_here(k: int) -> None:
            self.receiving.set()
            on_bytes(k)

        self.on_bytes = on_bytes_here

    def run(self) -> None:
        attempts = 0
        while True:
            try:
                finished = self._session()
            except Exception as e:  # noqa: BLE001 - e.g. ssh missing; the stream's work is given back
                finished, why = False, str(e)
            else:
                why = "connection lost"
            if finished:
                return
            attempts += 1
            if attempts > self.options.stream_retries:
                self.gave_up = why
                return
            time.sleep(min(2.0, 0.25 * 2**attempts))

    def _session(self) -> bool:
        """True when the queue ran dry and every taken segment completed."""
        proc, self.proc = self.proc or start_send_helper(self.argv), None
        in_flight: collections.deque[_Segment] = collections.deque()

        def refill() -> None:
            while len(in_flight) < self.REQUESTS_IN_FLIGHT and (seg := self.work.take()) is not None:
                in_flight.append(seg)
                proc.stdin.write(json.dumps(seg.request()).encode() + b"\n")
            if not in_flight:
                proc.stdin.close()  # nothing more to ask: the helper exits

        try:
            ready = _read_exact(proc.stdout, _FRAME_HEADER.size)
            if len(ready) < _FRAME_HEADER.size or _FRAME_HEADER.unpack(ready)[0] != 3:
                return False
            asked = time.monotonic()
            proc.stdin.write(json.dumps(self.root).encode() + b"\n")
            refill()
            while in_flight:
                header = _read_exact(proc.stdout, _FRAME_HEADER.size)
                if len(header) < _FRAME_HEADER.size:
                    return False  # dropped link or killed helper
                status, length = _FRAME_HEADER.unpack(header)
                if self.round_trip_s is None:
                    self.round_trip_s = time.monotonic() - asked  # one request, one answer
                seg = in_flight[0]
                if status == 0:
                    if seg.part.receive(seg.piece, proc.stdout.fileno(), length, self.on_bytes) < length:
                        return False
                    continue
                if status == 1:
                    seg.part.failed = "changed on the host during the pull"
                in_flight.popleft()
                self.hasher.queue.put(seg.part)
                refill()
            return True
        except (BrokenPipeError, OSError):
            return False
        finally:
            self.work.give_back([s for s in in_flight if s.part.failed is None and s.remaining > 0])
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass


def _stop(proc: subprocess.Popen | None) -> None:
    """End a prestarted stream that was not needed (it has been sent nothing: no effect)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()  # do not wait for a handshake that may still be under way
        proc.wait()
    if proc is not None:
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def pull(
    transport: Transport,
    remote_path: str,
    local_dir: str | os.PathLike[str],
    options: PullOptions = PullOptions(),
    progress: PullProgress | None = None,
) -> PullReport:
    """Fetch remote_path into local_dir; see the module docstring. Never raises for per-file
    problems: they are in the report (`report.ok`)."""
    progress = progress or PullProgress()
    started = time.monotonic()
    report = PullReport(local_dir=str(local_dir))
    local_root = Path(local_dir)
    only: set[str] | None = None
    only_why: dict[str, str] = {}
    for attempt in range(options.retries + 1):
        try:
            retry = _pull_once(transport, remote_path, local_root, options, progress, report, only, first=attempt == 0)
        except HarnessError as e:
            if only is None:
                raise  # nothing done yet: the caller reports the one error
            report.failed.extend((rel, f"{why}; retry failed: {e}") for rel, why in sorted(only_why.items()))
            break
        if not retry:
            break
        if attempt == options.retries:
            report.failed.extend(retry.items())
            break
        only, only_why = set(retry), retry
    report.seconds = time.monotonic() - started
    return report


def _pull_once(transport, remote_path, local_root: Path, options: PullOptions, progress: PullProgress, report: PullReport, only: set[str] | None, first: bool) -> dict[str, str]:
    """One listing/hash/fetch/verify pass. Returns {rel: why} of files worth another attempt."""
    # The first stream is set up while the listing runs (it waits for its root), in two
    # flavours: over the shared ControlMaster (no handshake: best for small pulls) and over its
    # own connection (no relay through the master process: best for big ones). _fetch_all keeps
    # one and ends the other.
    prestarted: dict[str, subprocess.Popen] = {}
    if not options.dry_run:
        send = helper_argv(options.python, "send", "-")
        prestarted["shared"] = start_send_helper(transport.local_argv(send))
        own = transport.own_connection_argv(send)
        if own is not None:
            prestarted["own"] = start_send_helper(own)
    try:
        return _pull_pass(transport, remote_path, local_root, options, progress, report, only, first, prestarted)
    finally:
        for proc in prestarted.values():  # whatever was not consumed (an error on the way)
            if proc.poll() is None and proc.stdin is not None and not proc.stdin.closed:
                _stop(proc)


def _pull_pass(transport, remote_path, local_root: Path, options: PullOptions, progress: PullProgress, report: PullReport, only: set[str] | None, first: bool, prestarted) -> dict[str, str]:
    root, is_dir, entries = list_remote(transport, remote_path, options.python)
    report.remote_root = root
    chosen = select(entries, options)
    if only is not None:
        chosen = [e for e in chosen if e.rel in only]
    files: list[RemoteEntry] = []
    links: list[RemoteEntry] = []
    for e in chosen:
        if clean_rel(e.rel) is None:
            if first:
                report.refused.append((e.rel, "name leads outside the destination"))
        elif e.kind == "file":
            files.append(e)
        elif e.kind == "link":
            if link_target_ok(e.rel, e.target):
                links.append(e)
            elif first:
                report.refused.append((e.rel, f"symlink to {e.target!r} leads outside the destination"))
        elif first:
            report.refused.append((e.rel, "not a regular file or symlink"))
    if options.dry_run:
        report.planned = [e.rel for e in files + links]
        return {}
    local_root.mkdir(parents=True, exist_ok=True)
    targets: dict[str, Path] = {}
    for e in files + links:
        try:
            targets[e.rel] = safe_parent(local_root, e.rel) / os.path.basename(e.rel)
        except _Unsafe as why:
            report.refused.append((e.rel, str(why)))
    files = [e for e in files if e.rel in targets]
    links = [e for e in links if e.rel in targets]
    hashes = _HashJob(transport, root, [e.rel for e in files], options.python)

    # Files already here with the right size may be identical: compare hashes before fetching.
    maybe_same = [e for e in files if targets[e.rel].is_file() and not targets[e.rel].is_symlink() and targets[e.rel].stat().st_size == e.size]
    to_fetch = [e for e in files if e not in maybe_same]
    retry: dict[str, str] = {}
    parts = {e.rel: _PartFile(targets[e.rel], e, options.piece_size) for e in to_fetch}
    total = sum(e.size for e in files)
    progress.start(len(files), total, sum(p.resumed_bytes for p in parts.values()) + sum(e.size for e in maybe_same))
    report.bytes_resumed += sum(p.resumed_bytes for p in parts.values())

    counters = {"received": 0}
    hasher = _Hasher()
    hasher.start()
    fetcher = threading.Thread(target=_fetch_all, args=(transport, root, list(parts.values()), options, hasher, progress, counters, prestarted), daemon=True)
    fetcher.start()
    differing: list[RemoteEntry] = []
    for e in maybe_same:
        digest, _, _, err = hashes.get(e.rel)
        if err is None and digest == sha256_file(targets[e.rel]):
            report.identical.append(e.rel)
            progress.file_done(e.rel)
        else:
            differing.append(e)
    fetcher.join()
    if differing:
        more = {e.rel: _PartFile(targets[e.rel], e, options.piece_size) for e in differing}
        progress.start(len(files), total, total - sum(e.size for e in differing) + sum(p.resumed_bytes for p in more.values()))
        _fetch_all(transport, root, list(more.values()), options, hasher, progress, counters)
        parts.update(more)
    hasher.queue.put(None)
    hasher.join()
    report.bytes_received += counters["received"]
    report.streams = max(report.streams, counters.get("streams", 0))

    for rel, part in parts.items():
        if part.failed is None and part.complete:
            part.hash_ready_pieces()  # empty files, and pieces completed by an earlier process
        digest, size, mtime_ns, err = hashes.get(rel)
        keep = False  # True: the bytes are good as far as we know; a later pull resumes them
        if part.failed is not None:
            why, keep = part.failed, not part.failed.startswith("changed")
        elif not part.complete:
            why, keep = "incomplete (run the same pull again to resume)", True
        elif err is not None:
            why, keep = f"host hash: {err}", err.startswith(HOST_HASHING_FAILED)
        elif (size, mtime_ns) != (part.entry.size, part.entry.mtime_ns):
            why = "changed on the host during the pull"
        elif digest != part.local_sha256:
            why = "SHA-256 mismatch"
        else:
            part.finish(part.entry.mode)
            report.fetched.append(rel)
            progress.file_done(rel)
            continue
        if keep:
            part.close()  # the bytes stay: the next attempt (or pull) resumes and verifies them
            retry[rel] = why
        else:
            part.discard()  # never keep bytes that do not verify
            retry[rel] = why

    for e in links:
        target = targets[e.rel]
        tmp = target.with_name(f".{target.name}{PART_SUFFIX}-link")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(e.target, tmp)
        os.replace(tmp, target)
        report.links.append(e.rel)
    return retry


def _fetch_all(transport, root, parts: list[_PartFile], options: PullOptions, hasher: _Hasher, progress: PullProgress, counters: dict, prestarted: dict[str, subprocess.Popen] | None = None) -> None:
    """Fetch every incomplete piece of parts. Streams are added while they pay off: start with
    one (on the shared connection, or on its own for a big pull) and time its first request (the link's round trip). Below
    LONG_LINK_RTT_S stay at one (loopback/LAN: crypto-bound, more streams only compete). On a
    long link go to FIRST_STEP_STREAMS (at once for a big pull), then, measuring ADD_INTERVAL_S
    once every stream delivers, double (each new stream on its own connection, up to jobs) as
    long as the last step raised the aggregate rate by ADD_GAIN. A long link is window-bound per stream, so more streams help
    there; loopback is CPU-bound, so they do not, and the pull stays at one or two."""
    for p in parts:
        hasher.queue.put(p)  # pieces already complete (resumed) are hashed right away
    work = _WorkQueue([_Segment(p, i) for p in parts for i in range(len(p.pieces)) if not p.piece_complete(i)])
    prestarted = dict(prestarted or {})
    if work.remaining_bytes() == 0:
        for proc in prestarted.values():
            _stop(proc)
        return
    lock = threading.Lock()

    def on_bytes(k: int) -> None:
        with lock:
            counters["received"] += k
        progress.advance(k)

    send = helper_argv(options.python, "send", "-")
    shared = transport.local_argv(send)
    own = transport.own_connection_argv(send) or shared
    big = work.remaining_bytes() >= OWN_CONNECTION_FROM_BYTES and "own" in prestarted
    first_argv, first_kind = (own, "own") if big else (shared, "shared")
    first_proc = prestarted.pop(first_kind, None)
    for proc in prestarted.values():
        _stop(proc)
    streams = [_Stream(first_argv, root, work, options, hasher, on_bytes, first_proc)]
    if not options.adaptive:
        streams += [_Stream(own, root, work, options, hasher, on_bytes) for _ in range(options.jobs - 1)]

    for st in streams:
        st.start()
    adding = options.adaptive and options.jobs > 1
    best_rate, mark_bytes, mark_time = 0.0, 0, None
    while any(st.is_alive() for st in streams):
        for st in streams:
            st.join(ADD_INTERVAL_S / 10)
        if not adding:
            continue
        now = time.monotonic()
        if mark_time is None:
            # measure only once every stream delivers: connection set-up is not throughput
            if all(st.receiving.is_set() or not st.is_alive() for st in streams):
                mark_bytes, mark_time = counters["received"], now
                if len(streams) == 1:
                    rtt = streams[0].round_trip_s or 0.0
                    if rtt < LONG_LINK_RTT_S:
                        adding = False  # a short link: one stream is CPU-bound, more only compete
                    elif work.remaining_bytes() >= BIG_PULL_BYTES:
                        # a long link and a big pull: go to the first step at once (the ramp costs)
                        for _ in range(min(options.jobs, FIRST_STEP_STREAMS) - 1):
                            streams.append(_Stream(own, root, work, options, hasher, on_bytes))
                            streams[-1].start()
                        mark_time = None
            continue
        if now - mark_time < ADD_INTERVAL_S:
            continue
        rate = (counters["received"] - mark_bytes) / (now - mark_time)
        if len(streams) > 1 and rate < best_rate * ADD_GAIN:
            adding = False  # the last streams added did not pay for themselves: keep what we have
            continue
        best_rate = max(best_rate, rate)
        # first step to FIRST_STEP_STREAMS (one more measurement saved on a long link), then double
        more = min(max(len(streams), FIRST_STEP_STREAMS - len(streams)), options.jobs - len(streams))
        if more <= 0 or work.remaining_bytes() < 2 * rate * ADD_INTERVAL_S:
            adding = False
            continue
        for _ in range(more):
            streams.append(_Stream(own, root, work, options, hasher, on_bytes))
            streams[-1].start()
        mark_time = None
    counters["streams"] = max(counters.get("streams", 0), len(streams))
    why = next((st.gave_up for st in streams if st.gave_up), "connection lost")
    for seg in work.drain():
        if seg.part.failed is None and seg.remaining > 0:
            seg.part.failed = f"{why} (run the same pull again to resume)"
