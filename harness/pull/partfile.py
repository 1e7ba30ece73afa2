"""The part files of a file in flight, next to its target: what has arrived, persisted so that a
new process can resume, and renamed to the target only once verified."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path
from typing import Callable

from harness.pull.options import MiB
from harness.pull.selection import RemoteEntry

PART_SUFFIX = ".harness-part"
COUNTERS = struct.Struct("<Q")
SPLICE = hasattr(os, "splice")  # Linux: stream bytes go pipe -> file without passing through Python


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
    return sum(COUNTERS.unpack_from(raw, i)[0] for i in range(0, len(raw) - len(raw) % 8, 8))


class PartFile:
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
        os.pwrite(self.counters_fd, b"".join(COUNTERS.pack(d) for d in self.done), 0)
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
        os.pwrite(self.counters_fd, COUNTERS.pack(self.done[piece]), 8 * piece)

    def receive(self, piece: int, pipe_fd: int, length: int, on_bytes: Callable[[int], None]) -> int:
        """Move `length` bytes from the stream into this piece (zero-copy splice on Linux);
        returns how many arrived (fewer: the stream ended). The counter follows the bytes."""
        start, _ = self.pieces[piece]
        moved = 0
        while moved < length:
            offset = start + self.done[piece]
            if SPLICE:
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
