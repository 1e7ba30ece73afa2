"""Doing one thing on several hosts at once: a thread per host, and their output merged line by
line with each host's name (a group's run, sync, build and doctor; `harness check-extract`)."""

from __future__ import annotations

import json
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from harness.transport.base import Transport


def parallel(items: Sequence[Any], fn: Callable[[Any], Any], timeout: float | None = None) -> list[tuple[Any, Any, BaseException | None]]:
    """fn(item) for every item at once (one thread each); [(item, result, error)] in order.
    `timeout`: seconds for all of them; an item not done by then is a TimeoutError (its thread is
    left to end by itself)."""
    import time

    results: list[Any] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)
    done = [False] * len(items)

    def one(i: int) -> None:
        try:
            results[i] = fn(items[i])
        except BaseException as e:  # noqa: BLE001 - reported per item
            errors[i] = e
        done[i] = True

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    for i in range(len(items)):
        if not done[i]:
            errors[i] = TimeoutError(f"no answer within {timeout:.0f} s")
    return [(items[i], results[i], errors[i]) for i in range(len(items))]


def open_all(transport_for: Callable[[str], "Transport"], hosts: Sequence[str]) -> dict[str, "Transport"]:
    """Connect to every host in parallel; the first failure is raised (naming its host)."""

    def connect(name: str):
        return transport_for(name).open()

    out = {}
    for name, transport, error in parallel(list(hosts), connect):
        if error is not None:
            raise error
        out[name] = transport
    return out


class LinePrefixer:
    """Bytes from one node's log -> whole lines, each handed on with the node's name."""

    def __init__(self, host: str, write: Callable[[str, bytes], None]):
        self.host = host
        self.write = write
        self.pending = b""

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        *lines, self.pending = data.split(b"\n")
        for line in lines:
            self.write(self.host, line + b"\n")

    def flush(self) -> None:
        if self.pending:
            self.write(self.host, self.pending + b"\n")
            self.pending = b""


def prefixed_sink(sink: Callable[[bytes], None]) -> Callable[[str, bytes], None]:
    """A thread-safe writer of `[host] line` into sink."""
    lock = threading.Lock()

    def write(host: str, line: bytes) -> None:
        with lock:
            sink(f"[{host}] ".encode() + line)

    return write


def host_json_sink(sink: Callable[[bytes], None]) -> Callable[[str, bytes], None]:
    """A thread-safe writer of a node's JSON log lines with its "host" added (a line that is no
    JSON object, e.g. a node's error, becomes {"host", "error"})."""
    lock = threading.Lock()

    def write(host: str, line: bytes) -> None:
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        if not isinstance(item, dict):
            item = {"error": line.decode("utf-8", "replace").strip()}
        with lock:
            sink((json.dumps({"host": host, **item}) + "\n").encode())

    return write


def prefixed_writer(stream=None) -> Callable[[str, bytes], None]:
    """A thread-safe writer of `[host] line` to stdout."""
    out = stream or sys.stdout.buffer

    def sink(data: bytes) -> None:
        out.write(data)
        out.flush()

    return prefixed_sink(sink)
