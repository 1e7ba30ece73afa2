"""The `follow` request (`harness logs`): a run's stage logs from their first byte or their last
lines, in stage order, raw or as JSON lines with the stages' events and states; with follow, until
the run ends. A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS);
standard library only.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.follow (tests)
    from harness.host_helpers import run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files


FOLLOW_SETTLE_S = 30.0  # at most this long from a followed run's last stage to its recorded outcome


def cmd_follow(run_dir: str, only_stage: str | None, follow: bool, as_json: bool, tail: int | None = None) -> int:
    """Print stage logs from their first byte (tail: from the start of their last `tail` lines,
    stages in order); with --follow, keep going until the run ends.

    Raw mode writes the log bytes unchanged. JSON mode writes one object per line:
    {"stage", "log": text} | {"stage", "event": {...}} | {"stage", "state": {...}}.
    """
    record = run_files.read_json(os.path.join(run_dir, "run.json"))
    if not record:
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    stages = record["stages"]
    if only_stage is not None:
        if only_stage not in stages:
            print(f"run {record.get('run_id')} has no stage {only_stage!r} (stages: {', '.join(stages)})", file=sys.stderr)
            return 2
        stages = [only_stage]
    first, first_offset = tail_start(run_dir, stages, tail) if tail is not None else (0, 0)
    stages = stages[first:]
    out = sys.stdout.buffer

    def emit(obj: dict) -> None:
        out.write((json.dumps(obj) + "\n").encode())
        out.flush()

    for i, stage in enumerate(stages):
        sd = run_files.stage_dir(run_dir, stage)
        log_off, ev_off = (first_offset if i == 0 else 0), 0
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            st = run_files.read_json(os.path.join(sd, "state.json"), {}) or {}
            done = st.get("state") in run_files.FINAL_STAGE or run_over(run_dir) or not follow
            # Read AFTER the state check: output written before the stage ended is always seen.
            log_off, data = read_from(os.path.join(sd, "log"), log_off)
            if data:
                if as_json:
                    emit({"stage": stage, "log": decoder.decode(data)})
                else:
                    out.write(data)
                    out.flush()
            if as_json:
                ev_off, evdata = read_from(os.path.join(sd, "events.jsonl"), ev_off, whole_lines=True)
                for line in evdata.splitlines():
                    try:
                        emit({"stage": stage, "event": json.loads(line)})
                    except ValueError:
                        pass
            if done and not data:
                break
            if not data:
                time.sleep(run_files.POLL_S)
        st = run_files.read_json(os.path.join(sd, "state.json"), {}) or {}
        if as_json:
            emit({"stage": stage, "state": st or {"state": "pending"}})
        if st.get("state") not in ("ok",) and only_stage is None and follow:
            break  # the chain stopped here
    if follow and only_stage is None:
        # The run's outcome (and the skipped stages) are written just after its last stage's:
        # whoever reads the status next must see them.
        deadline = time.monotonic() + FOLLOW_SETTLE_S
        while not run_over(run_dir) and time.monotonic() < deadline:
            time.sleep(run_files.POLL_S)
    return 0


def run_over(run_dir: str) -> bool:
    """The run has an outcome, or nobody is left to write one (its supervisor's lock is free)."""
    run_state = (run_files.read_json(os.path.join(run_dir, "state.json"), {}) or {}).get("state")
    return run_state in run_files.FINAL_RUN or (run_state in run_files.LIVE_RUN and not run_files.lock_is_held(run_dir))


def tail_start(run_dir: str, stages: list, lines: int) -> tuple:
    """(index of the stage, byte offset in its log) where the last `lines` lines of the stages'
    logs, in order, begin. Reads each log backwards in blocks: a long log is not read whole."""
    wanted = max(0, lines)
    for i in range(len(stages) - 1, -1, -1):
        path = os.path.join(run_files.stage_dir(run_dir, stages[i]), "log")
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if not size:
            continue
        with open(path, "rb") as f:
            end = pos = size
            while pos > 0:
                start = max(0, pos - 65536)
                f.seek(start)
                block = f.read(pos - start)
                if pos == end and block.endswith(b"\n"):
                    block = block[:-1]  # the final newline ends the last line, it starts none
                    pos -= 1
                for j in range(len(block) - 1, -1, -1):
                    if block[j] == 10:
                        wanted -= 1
                        if wanted <= 0:
                            return i, start + j + 1
                pos = start
        wanted -= 1  # the stage's first line
        if wanted <= 0:
            return i, 0
    return 0, 0


def read_from(path: str, offset: int, whole_lines: bool = False, limit: int = 1 << 20) -> tuple[int, bytes]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return offset, b""
    if whole_lines and data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
    return offset + len(data), data
