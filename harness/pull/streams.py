"""Byte streams: long-lived `send` helpers on the host, each fed piece requests from one queue;
each piece comes with the host's CRC-32 of it, computed while sending (partfile.py checks it)."""

from __future__ import annotations

import collections
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from harness.errors import HarnessError
from harness.host_helpers import wire
from harness.pull.local_disk import LocalWriteFailed
from harness.pull.options import MiB, PullOptions
from harness.pull.partfile import CHECK, PartFile
from harness.transport.process import RemoteProcess

FRAME_HEADER = wire.FRAME_HEADER
StartStream = Callable[[], RemoteProcess]  # starts one stream's process on the host (Transport.stream)


@dataclass
class Segment:
    """What is left to do for one piece: its missing bytes and its check."""

    part: PartFile
    piece: int

    def request(self) -> list:
        """The helper's request (its piece's start: the host hashes the whole piece)."""
        start, end = self.part.pieces[self.piece]
        offset = self.part.begin(self.piece)
        return [self.part.entry.rel, start, offset, end, self.part.entry.size, self.part.entry.mtime_ns]

    @property
    def pending(self) -> bool:
        return self.part.failed is None and not self.part.verified[self.piece]

    @property
    def remaining(self) -> int:
        start, end = self.part.pieces[self.piece]
        return end - start - self.part.done[self.piece]


class WorkQueue:
    """Segments in file order, handed to whichever stream asks next (a faster stream simply
    takes more)."""

    def __init__(self, segments: list[Segment]):
        self._items = collections.deque(segments)
        self._lock = threading.Lock()
        self.local_error: LocalWriteFailed | None = None  # a local write failed: no stream takes more

    def stop(self, error: LocalWriteFailed) -> None:
        with self._lock:
            if self.local_error is None:
                self.local_error = error

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._items)

    def take(self) -> Segment | None:
        with self._lock:
            while self._items and self.local_error is None:
                seg = self._items.popleft()
                if seg.pending:
                    return seg
            return None

    def give_back(self, segments: list[Segment]) -> None:
        with self._lock:
            self._items.extendleft(reversed(segments))

    def remaining_bytes(self) -> int:
        with self._lock:
            return sum(s.remaining for s in self._items)

    def drain(self) -> list[Segment]:
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


def start_send_helper(start: "StartStream") -> RemoteProcess:
    proc = start()
    _widen_pipe(proc.stdout.fileno())
    return proc


def _widen_pipe(fd: int) -> None:
    """Linux: a 1 MiB pipe lets one read() take up to 1 MiB instead of 64 KiB (16x fewer
    system calls and Python round trips per GiB). Harmless where unsupported."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), MiB)
    except (ImportError, OSError):
        pass


def _ready(proc: RemoteProcess) -> bool:
    """The helper's first frame (FRAME_READY): it runs and reads requests."""
    header = _read_exact(proc.stdout, FRAME_HEADER.size)
    return len(header) == FRAME_HEADER.size and FRAME_HEADER.unpack(header)[0] == wire.FRAME_READY


def _read_frame(proc: RemoteProcess) -> tuple[int, bytes] | None:
    header = _read_exact(proc.stdout, FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size:
        return None
    status, length = FRAME_HEADER.unpack(header)
    data = _read_exact(proc.stdout, length)
    return (status, data) if len(data) == length else None


@dataclass(frozen=True)
class Listener:
    """The first helper's loopback listener on the host (pull_helper.py `{"listen": true}`):
    more streams of the pull as direct-tcpip channels to it. The token is never printed,
    logged or put on a command line: it travels over the helper's stdout and a stream's stdin."""

    port: int
    token: bytes = field(repr=False)


class StreamFailed(Exception):
    """The helper's stream ended before it answered; error(what) is the transport's typed error
    for it (ssh's own failure, else the helper's exit)."""

    def __init__(self, proc: RemoteProcess):
        super().__init__(f"exit {proc.returncode}")
        self.proc = proc

    def error(self, what: str) -> HarnessError:
        return self.proc.error(what)


class FirstStream:
    """A pull's first send helper, started at once over the shared master (one handshake and one
    remote start for everything): it answers questions before its first segment (`ask`: the
    listing, a small file, which paths exist; pull_helper.py), then `probe` times pings in the
    background, so the link's round trip is known when the fetch starts and it can open all the
    streams it calls for. Asked at its start, with listen, for a listener for more streams."""

    PINGS = 2  # the shortest counts: on a loaded machine one may wait for a CPU

    def __init__(self, start: "StartStream", listen: bool = False):
        self.proc = start_send_helper(start)
        self._ready = False
        self.round_trip_s: float | None = None
        self.listener: Listener | None = None  # where more streams of this pull can connect
        self.ok = False  # ready for segments: answered every question and the pings
        self._probe: threading.Thread | None = None
        self._listen = listen
        if listen:  # asked before the helper even runs; its answer is read with the first question's
            self._write([{"listen": True}])

    def ask(self, *requests: dict | None) -> list[tuple[int, bytes]]:
        """One frame per request (None: a ping), in order. Raises StreamFailed."""
        self._write(list(requests))
        if not self._ready:
            self._expect_ready()
        frames = [_read_frame(self.proc) for _ in requests]
        if any(f is None for f in frames):
            raise self._failed()
        return frames  # type: ignore[return-value]

    def _write(self, requests: list) -> None:
        try:
            self.proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        except (OSError, ValueError):
            raise self._failed() from None

    def _expect_ready(self) -> None:
        if not _ready(self.proc):
            raise self._failed()
        self._ready = True
        if self._listen:
            frame = _read_frame(self.proc)
            if frame is None or frame[0] != wire.FRAME_LISTENER:
                raise self._failed()
            doc = json.loads(frame[1])
            if "port" in doc:  # else the host could not listen: more streams start helpers of their own
                self.listener = Listener(int(doc["port"]), bytes.fromhex(doc["token"]))

    def _failed(self) -> StreamFailed:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return StreamFailed(self.proc)

    def probe(self, short_s: float, pings: int = PINGS) -> None:
        """Time up to `pings` pings in the background (until one is below short_s); `join` waits
        for them. pings=0: ready for segments, the round trip unknown."""
        self._probe = threading.Thread(target=self._ping, args=(short_s, pings), daemon=True)
        self._probe.start()

    def _ping(self, short_s: float, pings: int) -> None:
        try:
            if not self._ready:
                self._write([])
                self._expect_ready()
            for _ in range(pings):
                asked = time.monotonic()
                self.ask(None)
                rtt = time.monotonic() - asked
                self.round_trip_s = rtt if self.round_trip_s is None else min(self.round_trip_s, rtt)
                if rtt < short_s:
                    break
            self.ok = True
        except (StreamFailed, OSError, ValueError):
            pass

    def join(self) -> None:
        if self._probe is not None:
            self._probe.join()

    def stop(self) -> None:
        self.proc.stop()  # (it has been sent nothing where it was not needed: no effect)


class Stream(threading.Thread):
    """One long-lived helper (`send` mode) on the host, fed segment requests one line at a time
    (REQUESTS_IN_FLIGHT ahead, so there is no idle round trip between segments). A dropped
    stream returns its unfinished segments to the queue and reconnects, up to stream_retries.

    start() gives the stream's process (Transport.stream / stream_to). With a listener, it is a
    connection to the first helper's listener (a TCP channel of the master: no remote shell or
    Python to start) that sends listener's token first; where that fails (the sshd forbids
    forwarding, the listener has ended), the stream goes on as a helper of its own
    (fallback_start), at once and for good."""

    REQUESTS_IN_FLIGHT = 2  # at least; more while they are small, up to IN_FLIGHT_BYTES: a run's small files in one round trip
    IN_FLIGHT_BYTES = 2 * MiB
    MOST_IN_FLIGHT = 64

    def __init__(self, start: "StartStream", root: str, work: WorkQueue, options: PullOptions, on_bytes: Callable[[int], None],
                 connecting: FirstStream | None = None, listener: Listener | None = None, fallback_start: "StartStream | None" = None):
        super().__init__(daemon=True)
        self.start_process, self.root, self.work, self.options, self.on_bytes = start, root, work, options, on_bytes
        self.connecting = connecting  # already started (its connection set up while the listing ran)
        self.listener, self.fallback_start = listener, fallback_start
        self.gave_up: str | None = None
        self.receiving = threading.Event()  # set at the first byte
        self.round_trip_s: float | None = connecting.round_trip_s if connecting else None  # a request -> its answer

        def on_bytes_here(k: int) -> None:
            self.receiving.set()
            on_bytes(k)

        self.on_bytes = on_bytes_here

    def run(self) -> None:
        attempts = 0
        while True:
            try:
                finished = self._session()
            except LocalWriteFailed as e:  # the local disk's fault: no retry can help
                self.work.stop(e)
                return
            except Exception as e:  # noqa: BLE001 - e.g. ssh missing; the stream's work is given back
                finished, why = False, str(e)
            else:
                why = "connection lost"
            if finished:
                return
            if self.listener is not None and self.fallback_start is not None:
                self.start_process, self.listener = self.fallback_start, None  # not counted: the link is not to blame
                continue
            attempts += 1
            if attempts > self.options.stream_retries:
                self.gave_up = why
                return
            time.sleep(min(2.0, 0.25 * 2**attempts))

    def _session(self) -> bool:
        """True when the queue ran dry and every taken segment completed."""
        connecting, self.connecting = self.connecting, None
        if connecting is not None:
            connecting.join()
            proc = connecting.proc
        else:
            proc = start_send_helper(self.start_process)
        in_flight: collections.deque[Segment] = collections.deque()

        def wants_more() -> bool:
            if len(in_flight) < self.REQUESTS_IN_FLIGHT:
                return True
            return len(in_flight) < self.MOST_IN_FLIGHT and sum(s.remaining for s in in_flight) < self.IN_FLIGHT_BYTES

        def refill() -> None:
            asked = []
            while wants_more() and (seg := self.work.take()) is not None:
                in_flight.append(seg)
                asked.append(json.dumps(seg.request()).encode() + b"\n")
            if asked:
                proc.stdin.write(b"".join(asked))
            if not in_flight:
                proc.stdin.close()  # nothing more to ask: the helper exits

        try:
            if self.listener is not None:
                # token, root and the first requests at once: the channel opens while they travel
                proc.stdin.write(self.listener.token + json.dumps(self.root).encode() + b"\n")
                refill()
            if not (connecting.ok if connecting is not None else _ready(proc)):
                return False
            asked = time.monotonic()
            if self.listener is None:
                proc.stdin.write(json.dumps(self.root).encode() + b"\n")
                refill()
            while in_flight:
                header = _read_exact(proc.stdout, FRAME_HEADER.size)
                if len(header) < FRAME_HEADER.size:
                    return False  # dropped link or killed helper
                status, length = FRAME_HEADER.unpack(header)
                if self.round_trip_s is None and self.listener is None:  # (a forwarded one asked before its ready)
                    self.round_trip_s = time.monotonic() - asked  # one request, one answer
                seg = in_flight[0]
                if status == wire.FRAME_PIECE:
                    if seg.part.receive(seg.piece, proc.stdout.fileno(), length, self.on_bytes) < length:
                        return False
                    continue
                if status == wire.FRAME_CRC:
                    crc = _read_exact(proc.stdout, length)
                    if length != CHECK.size or len(crc) < length:
                        return False
                    seg.part.check(seg.piece, crc)
                else:
                    seg.part.failed = "changed on the host during the pull"
                in_flight.popleft()
                refill()
            return True
        except (BrokenPipeError, OSError):
            return False
        finally:
            self.work.give_back([s for s in in_flight if s.pending])
            proc.kill()
            proc.stop()
