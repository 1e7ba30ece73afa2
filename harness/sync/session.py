"""One sync's exchange with the host: ONE helper process (harness/host_helpers/sync_apply.py,
started by harness.helpers.start) that first sends the host's manifest, then, once the laptop has
planned, takes the plan's stream (harness.sync.framing) and applies it; or exits untouched when
the plan is dropped. `sync` on one host, `sync_hosts` on a group's at once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from harness import helpers
from harness.fanout import parallel
from harness.sync import framing
from harness.sync.hashing import LOCAL_CACHE_PATH
from harness.sync.manifest import Entry, manifest_digest, manifest_path, parse_manifest
from harness.sync.paths import normalize_roots, shown_path
from harness.sync.plan import plan_sync
from harness.sync.result import ProgressCallback, SyncError, SyncResult
from harness.sync.scan import scan_local
from harness.transport.base import Transport
from harness.transport.process import RemoteProcess
from harness.transport.remote_shell import sh_expand_home

if TYPE_CHECKING:
    from harness.config import Config

SYNC_APPLY = "sync_apply.py"
PROGRESS_EVERY_S = 0.05


def start_session(transport: Transport, python: str, workdir: str) -> RemoteProcess:
    """The apply helper (harness.helpers.start: its source and request {"workdir"} on stdin),
    run after a `cat` of the manifest (then a NUL): the manifest is on its way at once and the
    laptop plans while the interpreter starts. `~` in workdir is expanded on the host (by the
    shell for the manifest, by the helper)."""
    cat_manifest = f'm=$1; {sh_expand_home("m")}; ' + 'if [ -f "$m" ]; then cat -- "$m" || exit 2; fi; printf "\\000"; shift; exec "$@"'
    return helpers.start(transport, SYNC_APPLY, {"workdir": workdir}, python=python, before=["sh", "-c", cat_manifest, "sh", manifest_path(workdir)])


class PreparedSync:
    """A planned sync holding its one exec on the host (harness/host_helpers/sync_apply.py).

    The helper starts first and sends the host manifest; the local scan runs meanwhile; the plan
    is then either applied over the same exec (`apply`) or dropped (`close`: the helper exits
    without touching anything). A sync therefore costs one remote process, a no-op included.
    The scan is lazy: a file the hash cache does not know is read only to compare it with a host
    entry of the same size and mode; any other file is sent and hashed while it streams (a first
    sync reads each file once). Use as a context manager."""

    def __init__(self, transport: Transport, root: Path, paths: Sequence[str], workdir: str, *, exclude: Sequence[str] = (), python: str = "python3", cache_file: Path | None = None):
        self.transport, self.root, self.workdir = transport, Path(root), workdir
        roots = normalize_roots(paths)
        self._proc = start_session(transport, python, workdir)
        self._pending_out = b""
        self._done = False
        try:
            local = scan_local(self.root, roots, exclude, cache_file=cache_file if cache_file is not None else self.root / LOCAL_CACHE_PATH, hash_files=False)
            self._host, _ = parse_manifest(self._read_manifest())
            local.hash_unknown(self._host)
            if local.files_hashed:
                local.cache.save()  # kept even if the plan is dropped (a dry run, a group's preview)
            self.plan = plan_sync(local, self._host, roots)
        except BaseException:
            self.close()
            raise

    def _read_manifest(self) -> bytes:
        """The manifest bytes, up to the NUL that ends them (JSON never contains a raw NUL)."""
        buffer = b""
        fd = self._proc.stdout.fileno()
        while b"\0" not in buffer:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._fail("read the host manifest")
            buffer += chunk
        raw, _, self._pending_out = buffer.partition(b"\0")
        return raw

    def _fail(self, what: str) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        raise self._proc.error(f"sync helper on {self.transport.name} ({what})")

    def dry_run(self) -> SyncResult:
        """The plan with every hash known (the digest the sync would record); changes nothing."""
        self.plan.local.hash_unknown()
        self.plan.local.cache.save()
        self.plan = plan_sync(self.plan.local, self._host, self.plan.roots)
        return SyncResult(plan=self.plan, dry_run=True, manifest_digest=manifest_digest(self.plan.manifest))

    def _send_file(self, out: framing.Framer, rel: str, on_bytes: Callable[[int], None]) -> Entry | None:
        """One record (framing.write_file): the file as it is now, hashed as it streams (None: it
        is gone; a GONE record went instead)."""
        tree = self.plan.local
        try:
            fd = os.open(os.path.join(self.root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            framing.write_gone(out)
            tree.skipped.append((rel, f"cannot read: {e.strerror}"))
            return None
        try:
            entry, held_still = framing.write_file(out, fd, on_bytes)
        finally:
            os.close(fd)
        if held_still is not None:
            tree.cache.store(rel, held_still, entry.sha256)  # what was hashed is what the file holds
        return entry

    def apply(self, progress: ProgressCallback | None = None) -> SyncResult:
        """Carry out the plan; raises SyncError if the host refused any path."""
        plan = self.plan
        if plan.is_noop:
            self.close()
            plan.local.cache.save()
            return SyncResult(plan=plan, dry_run=False, manifest_digest=manifest_digest(plan.manifest))
        result = SyncResult(plan=plan, dry_run=False)
        sent = {"files": 0, "bytes": 0, "shown": 0.0}

        def on_bytes(n: int) -> None:
            sent["bytes"] += n
            if progress and time.monotonic() - sent["shown"] >= PROGRESS_EVERY_S:  # not per small file
                sent["shown"] = time.monotonic()
                progress(sent["files"], sent["bytes"])

        proc = self._proc
        try:
            stream = framing.Framer(proc.stdin)
            stream.write(framing.header_line(plan.roots, {p: plan.local.entries[p] for p in plan.upload}, plan.delete, plan.ignored_manifest_entries))
            for rel in plan.upload:
                if plan.local.entries[rel].kind == "file":
                    entry = self._send_file(stream, rel, on_bytes)
                    if entry is None:  # gone since the scan: the host keeps what it had
                        del plan.local.entries[rel]
                        plan.manifest.pop(rel)
                        if rel in self._host:
                            plan.manifest[rel] = self._host[rel]
                    else:
                        plan.local.entries[rel] = plan.manifest[rel] = entry
                sent["files"] += 1
            result.manifest_digest = manifest_digest(plan.manifest)
            stream.write(framing.digest_line(result.manifest_digest))
            stream.flush()
            if progress:
                progress(sent["files"], sent["bytes"])
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the helper died: its stderr says why
        plan.local.cache.save()
        out = self._pending_out + proc.stdout.read()
        code = proc.wait()
        self._done = True
        if code != 0 or not out.strip():
            raise proc.error("sync helper on " + self.transport.name)
        report = json.loads(out.decode().strip().splitlines()[-1])
        result.files_sent = report["written"]
        result.bytes_sent = sent["bytes"]
        result.deleted = report["deleted"]
        result.refused = [tuple(r) for r in report["refused"]]
        if result.refused:
            listed = "; ".join(f"{shown_path(p)}: {shown_path(why)}" for p, why in result.refused[:5])
            more = f" (and {len(result.refused) - 5} more)" if len(result.refused) > 5 else ""
            raise SyncError(f"the host refused {len(result.refused)} path(s): {listed}{more}")
        return result

    def close(self) -> None:
        """Let the helper go without changing anything (EOF before a header)."""
        if self._done:
            return
        self._done = True
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        # The helper changes nothing before it has a header, so there is nothing to wait for:
        # end our side now (the host side sees the channel close and exits).
        self._proc.stop()

    def __enter__(self) -> "PreparedSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sync(
    transport: Transport,
    root: Path,
    paths: Sequence[str],
    workdir: str,
    *,
    exclude: Sequence[str] = (),
    python: str = "python3",
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    cache_file: Path | None = None,
) -> SyncResult:
    """Push `paths` (relative to `root`) to `workdir` on the host (docs/architecture/sync.md, "harness sync, step by step")."""
    with PreparedSync(transport, root, paths, workdir, exclude=exclude, python=python, cache_file=cache_file) as prepared:
        return prepared.dry_run() if dry_run else prepared.apply(progress)


def sync_hosts(config: "Config", transports: dict[str, Transport], paths: Sequence[str], *, workdirs: dict[str, str] | None = None,
               on_plan: Callable[[str, Any], None] | None = None, progress_for: Callable[[str], Callable[[int, int], None]] | None = None):
    """`harness sync GROUP`: plan every host in turn (PreparedSync: a local scan, cached, while
    the host sends its manifest; one thread touches the local hash cache), then apply the plans
    on all hosts at once, one transport each. [(host, SyncResult, error)]."""
    hosts = list(transports)
    workdirs = workdirs or {h: config.host(h).workdir for h in hosts}
    prepared: dict[str, PreparedSync] = {}
    try:
        for h in hosts:
            prepared[h] = PreparedSync(transports[h], config.root, paths, workdirs[h], exclude=config.sync.exclude, python=config.host(h).python)
            if on_plan:
                on_plan(h, prepared[h].plan)
        return parallel(hosts, lambda h: prepared[h].apply(progress_for(h) if progress_for else None))
    finally:
        for p in prepared.values():
            p.close()
