"""A user-space TCP delay line: emulates a long link (tc netem is absent from this kernel).

Every chunk read from one side is held for the one-way delay (rtt/2) and then written to the
other side. Reading never waits for the delay, so data keeps flowing and in-flight bytes are
bounded only by the protocol's own windows (for SSH: each channel's window), which is exactly
what caps one stream on a real long link. An optional rate cap (bytes/s per direction) makes
transfers slow enough for tests to interrupt them; `cut()` drops every open connection at once
(a dropped link); `stall()` stops every byte in both directions, on open and new connections,
with every TCP connection left open (a link that hangs without closing) until `flow()`.

    from bench.delayline import DelayLine
    with DelayLine(("127.0.0.1", sshd_port), rtt_ms=50) as line:
        ... connect to 127.0.0.1:line.port ...

or from a shell: python bench/delayline.py TARGET_HOST:PORT --rtt-ms 50 [--listen-port N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import threading
import time


class DelayLine:
    def __init__(self, target: tuple[str, int], rtt_ms: float = 50.0, rate: float | None = None, listen_host: str = "127.0.0.1", listen_port: int = 0):
        self.target = target
        self.one_way = rtt_ms / 2000.0
        self.rate = rate  # bytes per second per direction, None = unlimited
        self.listen = (listen_host, listen_port)
        self.port = 0
        self.bytes_forwarded = 0  # both directions
        self.bytes_to_client = 0  # target -> connecting side (a pull's payload direction)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.stalled = False  # stall(): nothing is forwarded, nothing is closed

    # -- lifecycle (a private event loop in a daemon thread) --------------------------------------

    def start(self) -> "DelayLine":
        self._thread = threading.Thread(target=self._run, daemon=True, name="delayline")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay line did not start")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, *self.listen, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            self._server.close()
            self._drop_all()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def cut(self) -> None:
        """Drop every open connection (new ones are still accepted): a link that went down."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drop_all)

    def stall(self) -> None:
        """Bytes stop flowing both ways on every connection, open or new; none is closed."""
        self.stalled = True

    def flow(self) -> None:
        """End a stall (what was held is delivered to connections still open)."""
        self.stalled = False

    def _drop_all(self) -> None:
        for w in list(self._writers):
            transport = w.transport
            if transport is not None:
                transport.abort()
        self._writers.clear()
        for t in list(self._tasks):
            t.cancel()

    def __enter__(self) -> "DelayLine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- forwarding -------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target, limit=1 << 20)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        pipes = [asyncio.ensure_future(self._pipe(src, dst, to_client)) for src, dst, to_client in ((reader, up_writer, False), (up_reader, writer, True))]
        for t in pipes:
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        await asyncio.gather(*pipes, return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, to_client: bool) -> None:
        held: collections.deque[tuple[float, bytes]] = collections.deque()
        arrived = asyncio.Event()
        finished = False

        async def read_side() -> None:
            nonlocal finished
            try:
                while chunk := await src.read(1 << 18):
                    held.append((time.monotonic() + self.one_way, chunk))
                    arrived.set()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                finished = True
                arrived.set()

        reading = asyncio.ensure_future(read_side())
        next_free = time.monotonic()  # rate limiting: when the line is free again
        try:
            while True:
                if not held:
                    if finished:
                        break
                    arrived.clear()
                    await arrived.wait()
                    continue
                while self.stalled:
                    await asyncio.sleep(0.05)
                due, chunk = held.popleft()
                if self.rate:
                    next_free = max(next_free, time.monotonic()) + len(chunk) / self.rate
                    due = max(due, next_free)
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                dst.write(chunk)
                self.bytes_forwarded += len(chunk)
                if to_client:
                    self.bytes_to_client += len(chunk)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, asyncio.CancelledError, OSError):
            pass
        finally:
            reading.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate-mib", type=float, default=None, help="cap per direction, MiB/s")
    parser.add_argument("--listen-port", type=int, default=0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    line = DelayLine((host, int(port)), args.rtt_ms, args.rate_mib * (1 << 20) if args.rate_mib else None, listen_port=args.listen_port).start()
    print(f"delay line 127.0.0.1:{line.port} -> {args.target}, rtt {args.rtt_ms} ms", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        line.stop()


if __name__ == "__main__":
    main()
