"""One pull from start to report: `pull()` makes a PullSession, which holds everything the pull
knows (where from and to, its options, progress and report, the host's listing root, the
streams it runs and the bytes they moved) and walks it through listing, selection, fetching and
verification, with retries of the files that failed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from harness.errors import HarnessError, UsageError
from harness.pull.host import HostHashes, helper_argv, list_remote, parse_listing
from harness.pull.options import MiB, PullOptions, PullProgress, PullReport
from harness.pull.partfile import PART_SUFFIX, PartFile
from harness.pull.paths import Unsafe, clean_rel, link_target_ok, safe_parent
from harness.pull.selection import RemoteEntry, select
from harness.pull.streams import Connecting, Listener, Segment, Stream, WorkQueue
from harness.sync import sha256_file
from harness.transport.base import Transport

ADD_INTERVAL_S = 0.5  # how often the fetch considers adding a stream
ADD_GAIN = 1.25  # ... and the rate gain the previous doubling must have brought
FIRST_STEP_STREAMS = 4
BIG_PULL_BYTES = 256 * MiB
LONG_LINK_RTT_S = 0.015  # below: loopback/LAN, one stream (CPU-bound); above: window-bound streams
WINDOW_BYTES = 2 * MiB  # the SSH channel window: what one stream moves per round trip, at most


def streams_for(remaining: int, round_trip_s: float | None, jobs: int) -> int:
    """Streams to open at once for `remaining` bytes: one on a short link (CPU-bound); on a long
    one (window-bound: WINDOW_BYTES per round trip each) as many as the bytes pay for, each
    stream carrying at least what it moves in the time its channel of the master takes to set up."""
    if round_trip_s is None or round_trip_s < LONG_LINK_RTT_S:
        return 1
    per_stream_rate = WINDOW_BYTES / round_trip_s
    setup_s = 2 * round_trip_s + 0.1  # the channel's session, the helper's start, the first request
    return max(1, min(jobs, int(remaining // (per_stream_rate * setup_s))))


def pull(
    transport: Transport,
    remote_path: str,
    local_dir: str | os.PathLike[str],
    options: PullOptions = PullOptions(),
    progress: PullProgress | None = None,
) -> PullReport:
    """Fetch remote_path into local_dir; see the package docstring. Never raises for per-file
    problems: they are in the report (`report.ok`)."""
    return PullSession(transport, remote_path, Path(local_dir), options, progress or PullProgress()).run()


class PullSession:
    """The state of one pull."""

    def __init__(self, transport: Transport, remote_path: str, local_root: Path, options: PullOptions, progress: PullProgress):
        self.transport, self.remote_path, self.local_root = transport, remote_path, local_root
        self.options, self.progress = options, progress
        self.report = PullReport(local_dir=str(local_root))
        self.root = ""  # the host's resolved REMOTE_PATH directory (from the listing)
        self.send_argv = helper_argv(options.python, "send", "-")
        self.first: Connecting | None = None  # the first stream, started with the attempt (it brings the listing)
        self.received = 0  # bytes over the wire, this attempt
        self._received_lock = threading.Lock()

    def run(self) -> PullReport:
        started = time.monotonic()
        only: dict[str, str] | None = None  # a retry: {rel: why it failed}
        for attempt in range(self.options.retries + 1):
            try:
                retry = self._attempt(only)
            except HarnessError as e:
                if only is None:
                    raise  # nothing done yet: the caller reports the one error
                self.report.failed.extend((rel, f"{why}; retry failed: {e}") for rel, why in sorted(only.items()))
                break
            if not retry:
                break
            if attempt == self.options.retries:
                self.report.failed.extend(retry.items())
                break
            only = retry
        self.report.seconds = time.monotonic() - started
        return self.report

    # -- one attempt --------------------------------------------------------------------------------

    def _attempt(self, only: dict[str, str] | None) -> dict[str, str]:
        """One listing/hash/fetch/verify pass. Returns {rel: why} of files worth another attempt."""
        # The first stream starts at once, over the shared master (one handshake, which every
        # later stream and command reuses), and brings the listing before its first piece.
        if not self.options.dry_run:
            # it also opens a listener for the pull's further streams where they can reach it
            listen = self.options.jobs > 1 and self.transport.stdio_forward_argv("127.0.0.1", 1) is not None
            self.first = Connecting(self.transport.local_argv(self.send_argv), list_path=self.remote_path, short_s=LONG_LINK_RTT_S, listen=listen)
        try:
            return self._list_fetch_verify(only)
        finally:
            if self.first is not None:  # not consumed (an error on the way)
                self.first.stop()
                self.first = None

    def _listing(self) -> tuple[str, bool, list[RemoteEntry]]:
        """The first stream's listing; the `list` command where it brought none (its connection
        failed: the command's error says why, typed)."""
        first = self.first
        if first is not None:
            first.listed.wait()
            if first.list_error is not None:
                raise UsageError(f"{self.transport.name}:{self.remote_path}: {first.list_error.strip()}")
            if first.listing is not None:
                return parse_listing(first.listing)
        return list_remote(self.transport, self.remote_path, self.options.python)

    def _list_fetch_verify(self, only: dict[str, str] | None) -> dict[str, str]:
        first = only is None
        self.root, _, entries = self._listing()
        self.report.remote_root = self.root
        chosen = select(entries, self.options)
        if only is not None:
            chosen = [e for e in chosen if e.rel in only]
        files, links = self._safe_names(chosen, report_refused=first)
        if self.options.dry_run:
            self.report.planned = [e.rel for e in files + links]
            return {}
        self.local_root.mkdir(parents=True, exist_ok=True)
        targets: dict[str, Path] = {}
        for e in files + links:
            try:
                targets[e.rel] = safe_parent(self.local_root, e.rel) / os.path.basename(e.rel)
            except Unsafe as why:
                self.report.refused.append((e.rel, str(why)))
        files = [e for e in files if e.rel in targets]
        links = [e for e in links if e.rel in targets]
        # Files already here with the right size may be identical: compare whole-file hashes (the
        # host's in one command) before fetching. Fetched pieces come with their own.
        maybe_same = [e for e in files if targets[e.rel].is_file() and not targets[e.rel].is_symlink() and targets[e.rel].stat().st_size == e.size]
        hashes = HostHashes(self.transport, self.root, [e.rel for e in maybe_same], self.options.python)
        to_fetch = [e for e in files if e not in maybe_same]
        parts = {e.rel: PartFile(targets[e.rel], e, self.options.piece_size) for e in to_fetch}
        total = sum(e.size for e in files)
        resumed = sum(p.resumed_bytes for p in parts.values())
        self.progress.start(len(files), total, resumed + sum(e.size for e in maybe_same))
        self.report.bytes_resumed += resumed

        self.received = 0
        fetcher = threading.Thread(target=self._fetch, args=(list(parts.values()),), daemon=True)
        fetcher.start()
        differing: list[RemoteEntry] = []
        for e in maybe_same:
            digest, _, _, err = hashes.get(e.rel)
            if err is None and digest == sha256_file(targets[e.rel]):
                self.report.identical.append(e.rel)
                self.progress.file_done(e.rel)
            else:
                differing.append(e)
        fetcher.join()
        if differing:
            more = {e.rel: PartFile(targets[e.rel], e, self.options.piece_size) for e in differing}
            self.progress.start(len(files), total, total - sum(e.size for e in differing) + sum(p.resumed_bytes for p in more.values()))
            self._fetch(list(more.values()))
            parts.update(more)
        self.report.bytes_received += self.received

        retry = {rel: why for rel, part in parts.items() if (why := self._verify(part)) is not None}
        self._place_links(links, targets)
        return retry

    def _safe_names(self, chosen: list[RemoteEntry], report_refused: bool) -> tuple[list[RemoteEntry], list[RemoteEntry]]:
        """(files, links) whose names may land under LOCAL_DIR; the others refused (reported on
        the first attempt only)."""
        files: list[RemoteEntry] = []
        links: list[RemoteEntry] = []
        refused: list[tuple[str, str]] = []
        for e in chosen:
            if clean_rel(e.rel) is None:
                refused.append((e.rel, "name leads outside the destination"))
            elif e.kind == "file":
                files.append(e)
            elif e.kind == "link":
                if link_target_ok(e.rel, e.target):
                    links.append(e)
                else:
                    refused.append((e.rel, f"symlink to {e.target!r} leads outside the destination"))
            else:
                refused.append((e.rel, "not a regular file or symlink"))
        if report_refused:
            self.report.refused.extend(refused)
        return files, links

    def _verify(self, part: PartFile) -> str | None:
        """Rename a part whose every piece has the host's digest into place (None), or say why
        not; keep bytes that may be good for a later attempt to resume, discard the others."""
        if part.failed is None and part.verified_all:
            part.finish(part.entry.mode)
            self.report.fetched.append(part.entry.rel)
            self.progress.file_done(part.entry.rel)
            return None
        why = part.failed or "incomplete (run the same pull again to resume)"
        if why.startswith("changed"):
            part.discard()  # a copy of another version of the file
        else:
            part.close()  # each piece is checked again before it counts: a later pull resumes them
        return why

    def _place_links(self, links: list[RemoteEntry], targets: dict[str, Path]) -> None:
        for e in links:
            target = targets[e.rel]
            tmp = target.with_name(f".{target.name}{PART_SUFFIX}-link")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(e.target, tmp)
            os.replace(tmp, target)
            self.report.links.append(e.rel)

    # -- streams ------------------------------------------------------------------------------------

    def _on_bytes(self, k: int) -> None:
        with self._received_lock:
            self.received += k
        self.progress.advance(k)

    def _stream(self, argv: list[str], work: WorkQueue, connecting: Connecting | None = None, listener: Listener | None = None) -> Stream:
        if listener is not None:
            forward = self.transport.stdio_forward_argv("127.0.0.1", listener.port)
            stream = Stream(forward, self.root, work, self.options, self._on_bytes, listener=listener, fallback_argv=argv)
        else:
            stream = Stream(argv, self.root, work, self.options, self._on_bytes, connecting)
        stream.start()
        return stream

    def _fetch(self, parts: list[PartFile]) -> None:
        """Fetch every incomplete piece of parts. The first stream (started with the attempt,
        it brought the listing) timed pings, the link's round trip: the fetch opens at once as
        many streams as streams_for() says (one on loopback/LAN: crypto-bound, more only
        compete), as channels of the master. A later fetch (files found to differ) starts on one
        stream and times its first request. Then, measuring ADD_INTERVAL_S once every stream
        delivers, streams are added (first to FIRST_STEP_STREAMS, then doubling, each on its own
        connection, up to jobs) as long as the last step raised the aggregate rate by ADD_GAIN:
        a long link is window-bound per stream, so more streams help there."""
        # every piece: those an earlier process completed need their check too (no bytes move)
        work = WorkQueue([Segment(p, i) for p in parts for i in range(len(p.pieces))])
        first, self.first = self.first, None
        if not work:
            if first is not None:
                first.stop()
            return
        options = self.options
        shared = self.transport.local_argv(self.send_argv)
        own = self.transport.own_connection_argv(self.send_argv) or shared
        if first is not None:
            first.join()  # its round trip decides how many streams to open (the stream waits for it too)
        streams = [self._stream(shared, work, first)]
        if not options.adaptive:
            streams += [self._stream(own, work) for _ in range(options.jobs - 1)]
        elif first is not None:
            # channels of the master: they start at once (a new connection would take ~10 round
            # trips plus CPU before its first byte); connections to the first helper's listener
            # where it has one (no remote shell or Python to start), else helpers of their own
            more = streams_for(work.remaining_bytes(), first.round_trip_s, options.jobs) - 1
            streams += [self._stream(shared, work, listener=first.listener) for _ in range(more)]

        adding = options.adaptive and options.jobs > len(streams)
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
                    mark_bytes, mark_time = self.received, now
                    if len(streams) == 1:
                        rtt = streams[0].round_trip_s or 0.0
                        if rtt < LONG_LINK_RTT_S:
                            adding = False  # a short link: one stream is CPU-bound, more only compete
                        elif first is None and work.remaining_bytes() >= BIG_PULL_BYTES:
                            # a long link and a big pull: go to the first step at once (the ramp costs)
                            streams += [self._stream(own, work) for _ in range(min(options.jobs, FIRST_STEP_STREAMS) - 1)]
                            mark_time = None
                continue
            if now - mark_time < ADD_INTERVAL_S:
                continue
            rate = (self.received - mark_bytes) / (now - mark_time)
            if len(streams) > 1 and rate < best_rate * ADD_GAIN:
                adding = False  # the last streams added did not pay for themselves: keep what we have
                continue
            best_rate = max(best_rate, rate)
            # first step to FIRST_STEP_STREAMS (one more measurement saved on a long link), then double
            more = min(max(len(streams), FIRST_STEP_STREAMS - len(streams)), options.jobs - len(streams))
            if more <= 0 or work.remaining_bytes() < 2 * rate * ADD_INTERVAL_S:
                adding = False
                continue
            streams += [self._stream(own, work) for _ in range(more)]
            mark_time = None
        self.report.streams = max(self.report.streams, len(streams))
        why = next((st.gave_up for st in streams if st.gave_up), "connection lost")
        for seg in work.drain():
            if seg.pending:
                seg.part.failed = f"{why} (run the same pull again to resume)"
