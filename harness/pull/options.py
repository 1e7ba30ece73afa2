"""What a pull is asked to do (PullOptions), what it tells as it goes (PullProgress) and what
it did (PullReport)."""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20


@dataclass(frozen=True)
class PullOptions:
    include: tuple[str, ...] = ()  # gitignore-style; empty = everything
    exclude: tuple[str, ...] = ()
    latest_checkpoint: bool = False  # newest <ckpt root>/<epoch>/ only, plus run records and logs
    streams: int = 8  # most parallel byte streams (each beyond the first on its own connection)
    adaptive: bool = True  # add streams one by one while they raise throughput; False: all at once
    piece_size: int = 16 * MiB  # unit of parallelism and of resume bookkeeping
    retries: int = 2  # extra attempts for a file that failed verification or changed on the host
    stream_retries: int = 3  # reconnects of one stream after a dropped link, within one attempt
    python: str = "python3"  # interpreter on the host for the helper
    dry_run: bool = False


@dataclass
class PullReport:
    remote_root: str = ""
    local_dir: str = ""
    fetched: list[str] = field(default_factory=list)
    identical: list[str] = field(default_factory=list)  # already present with the same SHA-256
    links: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (name, why) - unsafe names
    failed: list[tuple[str, str]] = field(default_factory=list)  # (name, why) - not fetched/verified
    planned: list[str] = field(default_factory=list)  # dry run: what would be fetched
    bytes_received: int = 0  # over the wire, this invocation
    bytes_resumed: int = 0  # already on disk from an interrupted pull
    streams: int = 0  # most parallel streams used
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.refused and not self.failed


class PullProgress:
    """Hooks the CLI turns into a progress bar; every method may be called from worker threads."""

    def start(self, files: int, total_bytes: int, done_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file_done(self, rel: str) -> None: ...
