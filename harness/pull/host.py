"""Calls of the helper shipped to the host (harness/host_helpers/pull_helper.py): the host-side
SHA-256 of the selected files, a listing's parsing, and the command line of a byte stream."""

from __future__ import annotations

import json
import threading

from harness import host_helpers
from harness.pull.selection import RemoteEntry
from harness.transport.base import Transport

HOST_HASHING_FAILED = "host hashing failed"  # the hash command itself failed (not one file)


def _helper_source() -> str:
    return host_helpers.source("pull_helper.py")


_RUN_PYTHON = f'py=$1; shift; {host_helpers.SYSTEM_PYTHON_SH}; exec "$py" "$@"'


def helper_argv(python: str, mode: str, root: str) -> list[str]:
    # -S: the helper is stdlib only; skipping site (and its .pth files) saves most of the start-up
    return ["sh", "-c", _RUN_PYTHON, "sh", python, "-S", "-c", _helper_source(), mode, root]


def run_bulk(transport: Transport, argv: list[str], what: str, stdin: bytes = b"", stdout=None) -> None:
    """Run argv on the host through transport.stream (over the persistent master connection for
    SSH hosts): no new handshake, and a dropped link is re-established by the next call.
    stdout: a sink called with each chunk. Raises the transport's typed error (`what` failed)."""
    proc = transport.stream(argv)
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    while chunk := proc.stdout.read(1 << 16):
        stdout(chunk)
    if proc.wait() != 0:
        raise proc.error(what)


def parse_listing(doc: dict) -> tuple[str, bool, list[RemoteEntry]]:
    """One listing of the helper's (pull_helper.py `do_list`): (resolved root, is_dir, entries)."""
    entries = [RemoteEntry(str(e[0]), str(e[1]), int(e[2]), int(e[3]), int(e[4]), str(e[5])) for e in doc["entries"]]
    return doc["root"], bool(doc["is_dir"]), entries


class HostHashes:
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
                run_bulk(transport, helper_argv(python, "hash", root), f"pull_helper.py hash on {transport.name}", json.dumps(rels).encode(), sink)
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
