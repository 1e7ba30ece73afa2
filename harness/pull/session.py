"""One pull from start to report: a PullConnection starts the pull's first stream at once; it
answers questions (a run's record, which outputs exist) and then pulls one or more Sources, all
over one remote start. A PullSession holds everything the pull knows (where from and to, its
options, progress and report, the streams it runs and the bytes they moved) and walks it through
listing, selection, fetching and verification, with retries of the files that failed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError, UsageError
from harness.host_helpers import wire
from harness.pull.host import HostHashes, parse_listing, start_send
from harness.pull.local_disk import LocalDiskError, LocalWriteFailed, check_room, local_failure
from harness.pull.options import MiB, PullOptions, PullProgress, PullReport
from harness.pull.partfile import PART_SUFFIX, PartFile
from harness.pull.paths import Unsafe, clean_rel, link_target_ok, resolves_inside, safe_parent
from harness.pull.selection import RemoteEntry, select
from harness.pull.streams import FirstStream, Listener, Segment, StartStream, Stream, StreamFailed, WorkQueue
from harness.sync.hashing import sha256_file
from harness.transport.base import OWN, Transport
from harness.transport.process import RemoteProcess

ADD_INTERVAL_S = 0.5  # how often the fetch considers adding a stream
ADD_GAIN = 1.25  # ... and the rate gain the previous doubling must have brought
FIRST_STEP_STREAMS = 4
BIG_PULL_BYTES = 256 * MiB
LONG_LINK_RTT_S = 0.015  # below: loopback/LAN, one stream (CPU-bound); above: window-bound streams
WINDOW_BYTES = 2 * MiB  # the SSH channel window: what one stream moves per round trip, at most
ONE_STREAM_BYTES = 4 * WINDOW_BYTES  # below, streams_for() is 1 whatever the round trip (it tends to remaining / 2 windows)


def streams_for(remaining: int, round_trip_s: float | None, most: int) -> int:
    """Streams to open at once for `remaining` bytes: one on a short link (CPU-bound); on a long
    one (window-bound: WINDOW_BYTES per round trip each) as many as the bytes pay for, each
    stream carrying at least what it moves in the time its channel of the master takes to set up."""
    if round_trip_s is None or round_trip_s < LONG_LINK_RTT_S:
        return 1
    per_stream_rate = WINDOW_BYTES / round_trip_s
    setup_s = 2 * round_trip_s + 0.1  # the channel's session, the helper's start, the first request
    return max(1, min(most, int(remaining // (per_stream_rate * setup_s))))


@dataclass(frozen=True)
class Source:
    """A path on the host (absolute, or from `~`) and where its entries land: LOCAL_DIR/local."""

    remote: str
    local: str = "."
    latest_checkpoint: bool = False  # only its newest epoch directory (and records and logs)


def pull(
    transport: Transport,
    remote_path: str,
    local_dir: str | os.PathLike[str],
    options: PullOptions = PullOptions(),
    progress: PullProgress | None = None,
) -> PullReport:
    """Fetch remote_path into local_dir; see the package docstring. Never raises for per-file
    problems: they are in the report (`report.ok`)."""
    with PullConnection(transport, options) as connection:
        return connection.pull([Source(remote_path, ".", options.latest_checkpoint)], local_dir, progress)


class PullConnection:
    """The pull's first stream, started at once over the shared master: it answers questions
    about the host's files and then carries the pull's first bytes (`pull`), one remote start
    for all of it. Errors of the connection itself (unknown host key, unreachable) are typed."""

    def __init__(self, transport: Transport, options: PullOptions = PullOptions()):
        self.transport, self.options = transport, options
        self.first: FirstStream | None = start_first_stream(transport, options)

    def __enter__(self) -> "PullConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.first is not None:
            self.first.stop()
            self.first = None

    def _ask(self, request: dict) -> tuple[int, bytes]:
        if self.first is None:
            raise RuntimeError("this connection's stream already pulled")
        try:
            return self.first.ask(request)[0]
        except StreamFailed as e:
            raise e.error(f"pull on {self.transport.name}") from None

    def read(self, path: str) -> bytes:
        """A small file of the host's (at most 16 MiB). FileNotFoundError where there is none."""
        status, data = self._ask({"read": path})
        if status != wire.FRAME_ANSWER:
            error = json.loads(data)
            raise (FileNotFoundError if error["missing"] else OSError)(f"{self.transport.name}:{path}: {error['error']}")
        return data

    def existing(self, paths: list[str]) -> set[str]:
        """Which of paths exist on the host (links followed)."""
        return set(json.loads(self._ask({"exists": paths})[1])) & set(paths)

    def newest_run(self, runs_dir: str) -> str | None:
        """The run `last` names in runs_dir (the supervisor's order), or None."""
        status, data = self._ask({"newest_run": runs_dir})
        return json.loads(data) if status == wire.FRAME_ANSWER else None

    def pull(self, sources: list[Source], local_dir: str | os.PathLike[str], progress: PullProgress | None = None) -> PullReport:
        """Fetch every source into local_dir (each to its `local`); names in the report are
        relative to local_dir. Uses up this connection's stream."""
        first, self.first = self.first, None
        return PullSession(self.transport, sources, Path(local_dir), self.options, progress or PullProgress(), first).run()


def start_first_stream(transport: Transport, options: PullOptions) -> FirstStream:
    # it also asks for a listener for the pull's further streams where they can reach it
    listen = options.streams > 1 and not options.dry_run and transport.forwards_tcp
    try:
        return FirstStream(lambda: start_send(transport, options.python), listen=listen)
    except StreamFailed as e:  # ssh died before its first question was written (an unknown host)
        raise e.error(f"pull on {transport.name}") from None


@dataclass(frozen=True)
class Listed:
    """One source as the host listed it."""

    source: Source
    root: str  # the resolved directory its entries are relative to
    entries: list[RemoteEntry]


class PullSession:
    """The state of one pull. Names: `rel` is what the host opens, relative to `root` (the
    sources' common directory); `names[rel]` where it lands, relative to LOCAL_DIR (the report's names)."""

    def __init__(self, transport: Transport, sources: list[Source], local_root: Path, options: PullOptions, progress: PullProgress,
                 first: FirstStream | None = None):
        self.transport, self.sources, self.local_root = transport, sources, local_root
        self.options, self.progress = options, progress
        self.report = PullReport(local_dir=str(local_root))
        self.root = ""  # the sources' common directory on the host (from the listing)
        self.names: dict[str, str] = {}
        self.first = first  # the first stream, started ahead (it brings the listing)
        self.received = 0  # bytes over the wire, this attempt
        self._received_lock = threading.Lock()
        self._local_error: LocalWriteFailed | None = None  # a fetch's local write failed

    def run(self) -> PullReport:
        started = time.monotonic()
        only: dict[str, str] | None = None  # a retry: {rel: why it failed}
        for attempt in range(self.options.retries + 1):
            try:
                retry = self._attempt(only)
            except LocalDiskError:
                raise  # this machine's disk: another attempt cannot help
            except HarnessError as e:
                if only is None:
                    raise  # nothing done yet: the caller reports the one error
                self.report.failed.extend((self.names[rel], f"{why}; retry failed: {e}") for rel, why in sorted(only.items()))
                break
            if not retry:
                break
            if attempt == self.options.retries:
                self.report.failed.extend((self.names[rel], why) for rel, why in retry.items())
                break
            only = retry
        self.report.seconds = time.monotonic() - started
        return self.report

    # -- one attempt --------------------------------------------------------------------------------

    def _attempt(self, only: dict[str, str] | None) -> dict[str, str]:
        """One listing/hash/fetch/verify pass. Returns {rel: why} of files worth another attempt."""
        if self.first is None:  # a retry: a fresh stream, a fresh listing
            self.first = start_first_stream(self.transport, self.options)
        try:
            return self._list_fetch_verify(only)
        finally:
            if self.first is not None:  # not consumed (an error on the way, a dry run)
                self.first.stop()
                self.first = None

    def _listing(self) -> list[Listed]:
        """Every source's listing, in one question to the first stream."""
        assert self.first is not None
        try:
            status, data = self.first.ask({"list": [s.remote for s in self.sources]})[0]
        except StreamFailed as e:
            raise e.error(f"pull listing on {self.transport.name}") from None
        listed = []
        for source, doc in zip(self.sources, json.loads(data), strict=True):
            if "error" in doc:
                raise UsageError(f"{self.transport.name}:{source.remote}: {doc['error']}")
            root, _, entries = parse_listing(doc)
            listed.append(Listed(source, root, entries))
        return listed

    def _chosen(self, listed: list[Listed], report_refused: bool) -> list[RemoteEntry]:
        """The selected entries of every source, safe to land where they go, renamed to `rel`
        (below self.root); names[rel] is where each lands."""
        self.root = posixpath.commonpath([item.root for item in listed])
        chosen: list[RemoteEntry] = []
        taken: set[str] = set()
        for item in listed:
            options = dataclasses.replace(self.options, latest_checkpoint=item.source.latest_checkpoint)
            files, links = self._safe_names(select(item.entries, options), report_refused, item.source.local)
            for e in files + links:
                rel = posixpath.relpath(posixpath.join(item.root, e.rel), self.root)
                if rel in taken:
                    continue  # a file two sources list (a run's metrics.jsonl, also beside its checkpoints): once, where the first puts it
                taken.add(rel)
                self.names[rel] = _landing(item.source.local, e.rel)
                chosen.append(dataclasses.replace(e, rel=rel))
        return chosen

    def _list_fetch_verify(self, only: dict[str, str] | None) -> dict[str, str]:
        first = only is None
        listed = self._listing()
        chosen = self._chosen(listed, report_refused=first)
        self.report.remote_root = listed[0].root
        if only is not None:
            chosen = [e for e in chosen if e.rel in only]
        if self.options.dry_run:
            self.report.planned = [self.names[e.rel] for e in chosen]
            return {}
        # the link's round trip, timed while the files are opened here, decides how many streams
        # start; a pull that one stream carries whatever the round trip does not wait for it
        assert self.first is not None
        big = sum(e.size for e in chosen if e.kind == "file") >= ONE_STREAM_BYTES
        self.first.probe(LONG_LINK_RTT_S, FirstStream.PINGS if big else 0)
        targets: dict[str, Path] = {}
        with self._writing(sum(e.size for e in chosen)):
            self.local_root.mkdir(parents=True, exist_ok=True)
            for e in chosen:
                try:
                    name = self.names[e.rel]
                    targets[e.rel] = safe_parent(self.local_root, name) / os.path.basename(name)
                except Unsafe as why:
                    self.report.refused.append((self.names[e.rel], str(why)))
        files = [e for e in chosen if e.rel in targets and e.kind == "file"]
        links = [e for e in chosen if e.rel in targets and e.kind == "link"]
        # Files already here with the right size may be identical: compare whole-file hashes (the
        # host's in one command) before fetching. Fetched pieces come with their own.
        maybe_same = [e for e in files if targets[e.rel].is_file() and not targets[e.rel].is_symlink() and targets[e.rel].stat().st_size == e.size]
        hashes = HostHashes(self.transport, self.root, [e.rel for e in maybe_same], self.options.python)
        to_fetch = [e for e in files if e not in maybe_same]
        parts = self._part_files(to_fetch, targets)
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
                self.report.identical.append(self.names[e.rel])
                self.progress.file_done(self.names[e.rel])
            else:
                differing.append(e)
        fetcher.join()
        if differing and self._local_error is None:
            more = self._part_files(differing, targets)
            self.progress.start(len(files), total, total - sum(e.size for e in differing) + sum(p.resumed_bytes for p in more.values()))
            self._fetch(list(more.values()))
            parts.update(more)
        self.report.bytes_received += self.received

        retry = {rel: why for rel, part in parts.items() if (why := self._verify(part)) is not None}
        if self._local_error is not None:
            self._stop_on_local_error([parts[rel] for rel in retry])
        with self._writing(0):
            self._place_links(links, targets)
        return retry

    @contextlib.contextmanager
    def _writing(self, needed: int, path: Path | None = None):
        """Local writes: an OSError is this machine's fault, one LocalDiskError line."""
        try:
            yield
        except OSError as e:
            raise local_failure(e, self.local_root, needed, path) from None

    def _part_files(self, entries: list[RemoteEntry], targets: dict[str, Path]) -> dict[str, PartFile]:
        """The part files of entries, once what they still need fits on the local disk (else
        one line, and no part file left that holds nothing)."""
        parts: dict[str, PartFile] = {}
        try:
            needed = sum(e.size for e in entries)
            for e in entries:
                with self._writing(needed, targets[e.rel]):
                    parts[e.rel] = PartFile(targets[e.rel], e, self.options.piece_size)
            with self._writing(needed):
                check_room(self.local_root, sum(p.size - p.resumed_bytes for p in parts.values()))
        except LocalDiskError:
            self._keep_only_resumable(list(parts.values()))
            raise
        return parts

    def _keep_only_resumable(self, parts: list[PartFile]) -> None:
        for part in parts:
            if any(part.done):
                part.close()
            else:
                part.discard()

    def _stop_on_local_error(self, unfinished: list[PartFile]) -> None:
        """A write failed (the files completed are in place): keep the pieces written for a
        resume, and say why in one line."""
        failed = self._local_error
        assert failed is not None
        self._keep_only_resumable(unfinished)
        needed = sum(p.size - sum(p.done) for p in unfinished)
        raise local_failure(failed.error, self.local_root, needed, failed.path)

    def _safe_names(self, chosen: list[RemoteEntry], report_refused: bool, local: str) -> tuple[list[RemoteEntry], list[RemoteEntry]]:
        """(files, links) of one source whose names may land under LOCAL_DIR/local; the others
        refused (reported on the first attempt only)."""
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
            self.report.refused.extend((_landing(local, rel), why) for rel, why in refused)
        return files, links

    def _verify(self, part: PartFile) -> str | None:
        """Rename a part whose every piece has the host's CRC into place (None), or say why
        not; keep bytes that may be good for a later attempt to resume, discard the others."""
        if part.failed is None and part.verified_all:
            part.finish(part.entry.mode)
            self.report.fetched.append(self.names[part.entry.rel])
            self.progress.file_done(self.names[part.entry.rel])
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
            if not resolves_inside(self.local_root, target.parent, e.target):
                self.report.refused.append((self.names[e.rel], f"symlink to {e.target!r} leads outside the destination through what is on disk there"))
                continue
            if target.is_dir() and not target.is_symlink():
                self.report.refused.append((self.names[e.rel], "a symlink on the host, a directory here"))
                continue
            tmp = target.with_name(f".{target.name}{PART_SUFFIX}-link")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(e.target, tmp)
            os.replace(tmp, target)
            self.report.links.append(self.names[e.rel])

    # -- streams ------------------------------------------------------------------------------------

    def _on_bytes(self, k: int) -> None:
        with self._received_lock:
            self.received += k
        self.progress.advance(k)

    def _stream(self, start: StartStream, work: WorkQueue, connecting: FirstStream | None = None, listener: Listener | None = None) -> Stream:
        if listener is not None:
            port = listener.port
            stream = Stream(lambda: self.transport.stream_to("127.0.0.1", port), self.root, work, self.options, self._on_bytes,
                            listener=listener, fallback_start=start)
        else:
            stream = Stream(start, self.root, work, self.options, self._on_bytes, connecting)
        stream.start()
        return stream

    def _fetch(self, parts: list[PartFile]) -> None:
        """Fetch every incomplete piece of parts. The first stream (started with the attempt,
        it brought the listing) timed pings, the link's round trip: the fetch opens at once as
        many streams as streams_for() says (one on loopback/LAN: crypto-bound, more only
        compete), as channels of the master. A later fetch (files found to differ) starts on one
        stream and times its first request. Then, measuring ADD_INTERVAL_S once every stream
        delivers, streams are added (first to FIRST_STEP_STREAMS, then doubling, each on its own
        connection, up to options.streams) as long as the last step raised the aggregate rate by ADD_GAIN:
        a long link is window-bound per stream, so more streams help there."""
        # every piece: those an earlier process completed need their check too (no bytes move)
        work = WorkQueue([Segment(p, i) for p in parts for i in range(len(p.pieces))])
        first, self.first = self.first, None
        if not work:
            if first is not None:
                first.stop()
            return
        options = self.options

        def shared() -> RemoteProcess:
            return start_send(self.transport, options.python)

        def own() -> RemoteProcess:  # (the shared connection where there is no other: the local host)
            return start_send(self.transport, options.python, connection=OWN)

        if first is not None:
            first.join()  # its round trip decides how many streams to open (the stream waits for it too)
        streams = [self._stream(shared, work, first)]
        if not options.adaptive:
            streams += [self._stream(own, work) for _ in range(options.streams - 1)]
        elif first is not None:
            # channels of the master: they start at once (a new connection would take ~10 round
            # trips plus CPU before its first byte); connections to the first helper's listener
            # where it has one (no remote shell or Python to start), else helpers of their own
            more = streams_for(work.remaining_bytes(), first.round_trip_s, options.streams) - 1
            streams += [self._stream(shared, work, listener=first.listener) for _ in range(more)]

        adding = options.adaptive and options.streams > len(streams)
        best_rate, mark_bytes, mark_time = 0.0, 0, None
        while any(st.is_alive() for st in streams):
            for st in streams:
                st.join(ADD_INTERVAL_S / 10)
            if work.local_error is not None:
                adding = False
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
                            streams += [self._stream(own, work) for _ in range(min(options.streams, FIRST_STEP_STREAMS) - 1)]
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
            more = min(max(len(streams), FIRST_STEP_STREAMS - len(streams)), options.streams - len(streams))
            if more <= 0 or work.remaining_bytes() < 2 * rate * ADD_INTERVAL_S:
                adding = False
                continue
            streams += [self._stream(own, work) for _ in range(more)]
            mark_time = None
        self.report.streams = max(self.report.streams, len(streams))
        if work.local_error is not None and self._local_error is None:
            self._local_error = work.local_error
        why = next((st.gave_up for st in streams if st.gave_up), "connection lost")
        for seg in work.drain():
            if seg.pending:
                seg.part.failed = f"{why} (run the same pull again to resume)"


def _landing(local: str, rel: str) -> str:
    """Where a source's entry lands, relative to LOCAL_DIR."""
    return rel if local == "." else posixpath.join(local, rel)
