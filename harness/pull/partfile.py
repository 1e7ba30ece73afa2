"""The part files of a file in flight, next to its target: what has arrived, persisted so that a
new process can resume, and renamed to the target only once verified.

Verification is per piece and costs no second pass over the data: each piece's CRC-32 is
computed as its bytes arrive, from the piece's start (the bytes an earlier process received are
read back first), and compared with the one the host computed while sending it. A CRC, not
SHA-256 (a third of a pull's CPU on loopback): SSH already authenticates every byte in flight,
so the check is there for what SSH cannot see (a part file damaged or stale since an earlier
pull, a piece put together wrongly), which CRC-32 catches as storage and transfer systems do."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

from harness.host_helpers import wire
from harness.pull.local_disk import LocalWriteFailed
from harness.pull.options import MiB
from harness.pull.selection import RemoteEntry

PART_SUFFIX = ".harness-part"
COUNTERS = struct.Struct("<Q")
CHECK = wire.PIECE_CRC  # a piece's CRC-32 as the host sends it (pull_helper.py, a FRAME_CRC frame)


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
        self.verified = [False] * n  # the piece's bytes have the host's CRC (not persisted)
        self._crcs: dict[int, int] = {}  # pieces being received: the CRC-32 of their bytes so far
        self.resumed_bytes = 0
        self._load_or_create()
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.ftruncate(self.fd, self.size)
        self.counters_fd = os.open(self.counters, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.pwrite(self.counters_fd, b"".join(COUNTERS.pack(d) for d in self.done), 0)
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

    def begin(self, piece: int) -> int:
        """A stream is about to ask for the rest of piece: check-sum what is already here of it;
        returns the offset the host sends from."""
        start, _ = self.pieces[piece]
        crc, position, end = 0, start, start + self.done[piece]
        while position < end:
            data = os.pread(self.fd, min(4 * MiB, end - position), position)
            if not data:
                raise OSError(f"{self.part}: shorter than recorded")
            crc = zlib.crc32(data, crc)
            position += len(data)
        self._crcs[piece] = crc
        return end

    def receive(self, piece: int, pipe_fd: int, length: int, on_bytes: Callable[[int], None]) -> int:
        """Move `length` bytes from the stream into this piece, check-summing them on the way;
        returns how many arrived (fewer: the stream ended). The counter follows the bytes; a
        failed local write raises LocalWriteFailed."""
        start, _ = self.pieces[piece]
        crc = self._crcs[piece]
        moved = 0
        while moved < length:
            data = os.read(pipe_fd, min(length - moved, MiB))
            if not data:
                break
            crc = zlib.crc32(data, crc)
            written = 0
            try:
                while written < len(data):  # a short write (a disk filling up): the rest, or its error
                    n = os.pwrite(self.fd, data[written:], start + self.done[piece])
                    written += n
                    self.done[piece] += n  # each piece is written by one stream at a time
                    self._record(piece)
            except OSError as e:  # the local disk's fault, not the link's: the pull ends
                raise LocalWriteFailed(e, self.part) from None
            moved += len(data)
            on_bytes(len(data))
        self._crcs[piece] = crc
        return moved

    def check(self, piece: int, host_crc: bytes) -> None:
        """The host's CRC-32 of the whole piece (CHECK.pack): verified, or the piece starts over
        (its bytes are never kept) and the file fails this attempt."""
        crc = self._crcs.pop(piece)
        if self.piece_complete(piece) and CHECK.pack(crc) == host_crc:
            self.verified[piece] = True
            return
        self.done[piece] = 0
        self._record(piece)
        self.failed = "checksum mismatch"

    def piece_complete(self, i: int) -> bool:
        start, end = self.pieces[i]
        return self.done[i] >= end - start

    @property
    def verified_all(self) -> bool:
        return all(self.verified)

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
