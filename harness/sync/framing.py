"""The stream a sync sends to the host's apply helper (harness/host_helpers/sync_apply.py reads
it), after the helper's request line:

- one header line, JSON: the roots, the entries to upload (path -> Entry), the paths to delete,
  the manifest entries to drop;
- one record per file to send, in the header's order: size and permission bits (RECORD), the
  content, its raw SHA-256 (hashed as it was read: what the host holds, whatever happened to the
  file meanwhile); a file that vanished since the scan is a GONE record alone. Links travel in
  the header alone;
- one JSON line, {"digest": ...} of the resulting manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Callable

from harness.host_helpers import wire
from harness.sync.hashing import HASH_BLOCK
from harness.sync.manifest import Entry

RECORD = wire.SYNC_RECORD
GONE = wire.SYNC_GONE  # record size of a file that vanished (or became unreadable) since the scan
FLUSH = 1 << 20


class Framer:
    """Buffers small records into large pipe writes (5,000 small files: 5 writes, not 15,000)."""

    def __init__(self, raw):
        self.raw, self.buffer = raw, bytearray()

    def write(self, data) -> None:
        self.buffer += data
        if len(self.buffer) >= FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.raw.write(self.buffer)
            self.buffer.clear()
        self.raw.flush()


def header_line(roots: list[str], upload: dict[str, Entry], delete: list[str], drop: list[str]) -> bytes:
    header = {
        "roots": roots,
        "upload": {p: e.to_json() for p, e in upload.items()},
        "delete": delete,
        "drop": drop,
    }
    return json.dumps(header, ensure_ascii=True).encode() + b"\n"


def digest_line(digest: str) -> bytes:
    return json.dumps({"digest": digest}).encode() + b"\n"


def write_gone(out: Framer) -> None:
    out.write(RECORD.pack(GONE, 0))


def write_file(out: Framer, fd: int, on_bytes: Callable[[int], None]) -> tuple[Entry, os.stat_result | None]:
    """One file's record, from `fd` as the file is now, hashed as it streams. A file that shrank
    meanwhile is padded with zeros to the size announced: the hash says so, and the next sync
    sends it again. Returns the entry as sent, and the file's stat when it held still while it was
    read (what was hashed is what the file holds: the hash may be cached), else None."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    out.write(RECORD.pack(st.st_size, mode))
    h, left, complete = hashlib.sha256(), st.st_size, True
    while left:
        chunk = os.read(fd, min(left, HASH_BLOCK))
        if not chunk:
            chunk, complete = bytes(min(left, HASH_BLOCK)), False
        h.update(chunk)
        out.write(chunk)
        left -= len(chunk)
        if st.st_size > FLUSH:
            on_bytes(len(chunk))
    if st.st_size <= FLUSH:
        on_bytes(st.st_size)
    out.write(h.digest())
    after = os.fstat(fd)
    held_still = complete and (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return Entry("file", st.st_size, mode, h.hexdigest()), st if held_still else None
