"""Stage progress as JSON lines: the seam between the GPU side and the laptop.

Each stage appends one JSON object per line to `events.jsonl` (path from `--events` or the
HARNESS_EVENTS environment variable; when neither is set, events are only echoed to stderr
as human-readable lines, so a stage run by hand stays readable). Every object has "t" (unix
seconds), "stage" and "event": started, progress, metric, artifact, message, warning, finished
(a failed one says whose failure it was: CAUSES). The contract, field by field, is
docs/events.json; tests/test_events_contract.py holds this writer and the laptop's reader,
harness/events.py, to it. `run_stage` is every stage's main(): started, the run, then finished
with its summary or one failed line.

The laptop renders progress events as bars and metric events as tables and plots. This module
never imports harness (remote_scripts/ must run without it).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Callable

EVENTS_ENV = "HARNESS_EVENTS"
# Whose failure a failed stage was: its own; a peer's (another node of a group run failed and
# this one stopped because of it); or a cancel.
CAUSES = ("own", "peer", "cancelled")
# Acceptance lengths (tokens per verifier round) in metrics and summaries: a round yields at least
# one token, so a value below 1 (or NaN) was never measured. A stage that measured no round says
# why and fails; the writer refuses such a value as a bug (docs/events.json: acceptance_lengths).
ACCEPTANCE_LENGTHS = ("tau", "tau_per_position", "tau_without_loops", "served_tau", "delivered_tau", "evaluate_tau", "best_tau")
MIN_ACCEPTANCE_LENGTH = 1.0


def check_acceptance_lengths(fields: dict[str, Any]) -> None:
    """ValueError naming the first acceptance length in `fields` below 1 (None: not measured, allowed)."""
    for name in ACCEPTANCE_LENGTHS:
        value = fields.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= MIN_ACCEPTANCE_LENGTH:
            raise ValueError(f"bug: {name} {value} is below {MIN_ACCEPTANCE_LENGTH:g}, the least a verifier round yields: not a measurement")


class EventLog:
    def __init__(self, stage: str, path: str | None = None, echo: bool = True):
        self.stage = stage
        self.path = path or os.environ.get(EVENTS_ENV) or None
        self.echo = echo
        self._last_progress_echo = 0.0
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"t": round(time.time(), 3), "stage": self.stage, "event": event, **fields}
        if self.path:
            # One write() per line with O_APPEND: concurrent writers (ranks) never interleave lines.
            line = (json.dumps(record, default=str) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        if self.echo:
            self._echo(event, fields)

    def _echo(self, event: str, fields: dict[str, Any]) -> None:
        if event == "progress":
            now = time.monotonic()
            done = fields.get("step") == fields.get("total")
            if now - self._last_progress_echo < 5.0 and not done:
                return  # keep plain logs readable: at most one progress line per 5 s
            self._last_progress_echo = now
            text = f"{fields.get('step')}/{fields.get('total')} {fields.get('unit', '')}".strip()
        elif event == "metric":
            metrics = fields.get("metrics", {})
            text = f"step {fields.get('step')}: " + " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        elif event == "artifact":
            text = f"wrote {fields.get('kind', 'artifact')}: {fields.get('path')}"
        elif event in ("message", "warning"):
            text = str(fields.get("text"))
        elif event == "finished":
            text = str(fields.get("status")) + (f" ({fields['error']})" if fields.get("error") else "")
        else:
            text = json.dumps(fields, default=str)[:200]
        print(f"[{self.stage}] {event}: {text}", file=sys.stderr, flush=True)

    # Convenience wrappers: the names say what the laptop will show.
    def started(self, **args: Any) -> None:
        self.emit("started", args=args)

    def progress(self, step: int, total: int, unit: str = "steps") -> None:
        self.emit("progress", step=step, total=total, unit=unit)

    def metric(self, step: int, **metrics: float) -> None:
        check_acceptance_lengths(metrics)
        self.emit("metric", step=step, metrics=metrics)

    def artifact(self, path: str, kind: str) -> None:
        self.emit("artifact", path=os.path.abspath(path), kind=kind)

    def message(self, text: str) -> None:
        self.emit("message", text=text)

    def warning(self, text: str) -> None:
        """Something that will make the result worse, with its fix, in one line."""
        self.emit("warning", text=text)

    def finished(self, status: str = "ok", error: str | None = None, cause: str = "own", **extra: Any) -> None:
        """The stage ended; a failure carries its one-line error and its cause (CAUSES)."""
        fields: dict[str, Any] = {"status": status, **extra}
        if status == "failed":
            if cause not in CAUSES:
                raise ValueError(f"cause must be one of {CAUSES}, not {cause!r}")
            fields["error"] = error or "failed"
            fields["cause"] = cause
        elif error:
            fields["error"] = error
        self.emit("finished", **fields)

    def failed(self, error: BaseException, *, traceback: bool = True, where: str = "", places: tuple[str, ...] = ()) -> int:
        """End the stage on `error`: one line for the laptop (`finished` with status failed), the
        traceback in the log unless the error explains itself. Returns the exit code, 1.
        places: where the stage writes (a full disk is named among them)."""
        if traceback:
            import traceback as tb

            tb.print_exception(error)
        line = (disk_full(error, places) or f"{type(error).__name__}: {error}") + where
        try:
            self.finished("failed", error=line)
        except OSError:  # the events file's own disk is full: the log (stderr) has the line
            print(f"[{self.stage}] failed: {line}", file=sys.stderr, flush=True)
        return 1

    def log_only(self, event: str, **fields: Any) -> None:
        """`event` echoed to this process's log but not written to the events file: what a rank
        other than 0 of a distributed stage says of its own start and end (run_stage)."""
        if self.echo:
            self._echo(event, fields)


# A disk full as libraries that are not Python's own say it (safetensors: "IoError(Os { code: 28,
# kind: StorageFull, ... })"), where no OSError carries the errno.
DISK_FULL_WORDS = re.compile(r"No space left on device|Disk quota exceeded|StorageFull|QuotaExceeded")


def _disk_error(error: BaseException) -> OSError | None:
    """The OSError (ENOSPC, EDQUOT) behind `error`, itself, its causes or its words; else None."""
    import errno

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return e
        if not isinstance(e, OSError) and DISK_FULL_WORDS.search(str(e)):
            return OSError(errno.ENOSPC, "No space left on device")
        e = e.__cause__ or e.__context__
    return None


def disk_full(error: BaseException, places: tuple[str, ...] = ()) -> str | None:
    """The one line for a write that found its disk full (ENOSPC, EDQUOT): which disk (the
    file's where the error names one, else the fullest of `places` and the working directory)
    and what is free there; None for any other error."""
    error = _disk_error(error)
    if error is None:
        return None

    def disk(path: str) -> tuple[int, str]:
        place = os.path.abspath(path)
        while not os.path.exists(place):
            place = os.path.dirname(place)
        st = os.statvfs(place)
        mount = place
        while not os.path.ismount(mount):
            mount = os.path.dirname(mount)
        return st.f_bavail * st.f_frsize, mount

    candidates = [str(error.filename)] if error.filename else [str(p) for p in places if p] + [os.getcwd()]
    free, mount = min(disk(p) for p in candidates)
    size = f"{free / 2**20:.1f} MiB" if free < 2**30 else f"{free / 2**30:.1f} GiB"
    writing = f" (writing {error.filename})" if error.filename else ""
    return f"disk full: {mount} on the host has {size} free{writing}; free space there (or point the output elsewhere) and run the stage again"


def run_stage(stage: str, args: Any, run: Callable[[Any, EventLog], dict[str, Any]], *,
              self_explaining: tuple[type[BaseException], ...] = (), rank: int | None = None,
              started: dict[str, Any] | None = None, echo: bool = True, announce: bool = True,
              verifier_first: bool = True) -> int:
    """A stage's main(): `started` with its arguments (and `started`'s extra fields), then
    `run(args, events)`, whose returned summary goes into `finished`. An exception becomes one
    `failed` line and exit code 1 (its traceback stays in the log, unless it is one of
    `self_explaining`).

    A distributed stage's processes each call it with their `rank`: rank 0 writes `started` and
    `finished` to the events file, so the stage has one of each however many ranks run it; the
    other ranks only echo theirs (their own summary) to their log. A failure is the same on
    every rank: its `failed` line goes to the events file, naming the rank when it is not 0.
    `echo` False keeps a process's events out of its log (train's ranks other than 0);
    `announce` False writes no `started` (a launcher that runs this process wrote it).
    `verifier_first` False: the stage checks --verifier itself, only where it loads it."""
    events = EventLog(stage, getattr(args, "events", None), echo=echo)
    lead = rank is None or rank == 0
    arguments = {**{k: v for k, v in vars(args).items() if k != "events"}, **(started or {})}
    if lead and announce:
        events.started(**arguments)
    elif announce:
        events.log_only("started", args=arguments)
    try:
        from common.verifier_path import VerifierNotFound, check as check_verifier

        if verifier_first:
            check_verifier(getattr(args, "verifier", None))  # a missing path: one line, not the hub's
        summary = run(args, events)
        check_acceptance_lengths(summary)  # before `finished` is written: a bug fails the stage in one line
    except VerifierNotFound as e:
        return events.failed(e, traceback=False, where=f" (rank {rank})" if rank else "")
    except Exception as e:  # one line for the laptop; the traceback stays in the log
        places = tuple(str(v) for k, v in vars(args).items() if k in ("output", "events") and v)
        return events.failed(e, traceback=not isinstance(e, self_explaining), where=f" (rank {rank})" if rank else "", places=places)
    if lead:
        events.finished("ok", **summary)
    else:
        events.log_only("finished", status="ok", **summary)
    return 0


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def read_events(path: str) -> list[dict[str, Any]]:
    """Parse an events.jsonl, skipping a torn last line (the writer may be mid-append)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out
