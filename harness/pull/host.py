"""Calls of the helper shipped to the host (harness/host_helpers/pull_helper.py, through
harness.helpers): the host-side SHA-256 of the selected files, a listing's parsing, and the start
of a byte stream (a `send` helper)."""

from __future__ import annotations

import json
import threading

from harness import helpers
from harness.pull.selection import RemoteEntry
from harness.transport.base import SHARED, Transport
from harness.transport.process import RemoteProcess

PULL_HELPER = "pull_helper.py"
HOST_HASHING_FAILED = "host hashing failed"  # the hash command itself failed (not one file)


def start_send(transport: Transport, python: str, connection: str = SHARED) -> RemoteProcess:
    """A `send` helper (pull_helper.py): its stdin is open for questions, ROOT and segments, which
    follow the request line (harness.helpers.start)."""
    return helpers.start(transport, PULL_HELPER, {"mode": "send"}, python=python, connection=connection)


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
                request = {"mode": "hash", "root": root, "rels": rels}
                helpers.call(transport, PULL_HELPER, request, python=python, stdout=sink).checked(f"{PULL_HELPER} hash on {transport.name}")
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
