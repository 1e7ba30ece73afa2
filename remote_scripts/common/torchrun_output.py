"""Why a torchrun failed, in one line, read from the tail of its stderr.

torchrun's exit code says only that something failed (1). The cause is in what it printed: a
rank's own last words (a Python exception's final line, "terminate called without an active
exception", a check's message), then torchrun's "Root Cause (first observed failure)" block
naming the rank, its exit code and the signal that killed it; or, when torchrun itself failed
(its rendezvous store went away), its own exception. node_launcher.py tees torchrun's stderr,
keeps the tail, and puts this line into the node's verdict, so `harness status GROUP` shows
the cause without a trip through the logs.

`is_peer_loss` tells the two kinds of failure apart: a node whose ranks died of their own error
is where a group run went wrong; one whose ranks only lost a peer (a collective's connection
closed under them, the rendezvous store vanished) failed because another node did.
"""

from __future__ import annotations

import re

# torch's glog-style log lines ("E1130 15:30:29.505000 15234 .../api.py:1002] failed ..."): the
# elastic agent's own chatter, never a rank's last words.
_LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d")
_FIELD = re.compile(r"^\s+(\w+)\s*:\s*(.*)$")
_SIGNAL = re.compile(r"\((SIG[A-Z0-9]+)\)")
MAX_CHARS = 240

# What a rank or torchrun says when the failure happened elsewhere: Gloo's and NCCL's words for a
# peer that went away, torch's store and rendezvous errors when node 0's store did.
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Connection was likely closed"
    r"|remote process exited|ncclRemoteError|NCCL communicator was aborted|Watchdog caught collective operation timeout"
    r"|DistNetworkError|RendezvousConnectionError|RendezvousClosedError|Socket Timeout",
    re.IGNORECASE,
)


def failure_cause(stderr_tail: list[str]) -> str | None:
    """One line on why torchrun failed, or None when the tail holds nothing to go on."""
    lines = [line.rstrip() for line in stderr_tail if line.strip()]
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not tracebacks:
        return _short(_last_words(lines)) if lines else None
    # torchrun's own exception: the first unindented line after its last traceback's frames
    start = tracebacks[-1]
    raised = next((line for line in lines[start + 1 :] if not line.startswith((" ", "\t"))), "")
    if "ChildFailedError" not in raised:
        return _short(_without_module(raised)) if raised else None
    # A rank failed: torchrun's report follows the rank's own output.
    root = _root_cause(lines[start:])
    words = _last_words(lines[:start])
    return _short("; ".join(part for part in (root, words) if part)) or None


def is_peer_loss(cause: str | None) -> bool:
    """Whether this cause line says the ranks lost a peer rather than failed by themselves.
    No cause at all counts as a peer loss: waiting for a peer's word costs seconds, while
    claiming a failure as our own would point the user at the wrong node."""
    return cause is None or _PEER_LOSS.search(cause) is not None


def _root_cause(lines: list[str]) -> str | None:
    """`rank 0 (local_rank: 0): SIGABRT` from torchrun's Root Cause block."""
    try:
        at = next(i for i, line in enumerate(lines) if line.startswith("Root Cause"))
    except StopIteration:
        return None
    fields: dict[str, str] = {}
    for line in lines[at + 1 :]:
        if line.startswith("="):
            break
        match = _FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2).strip())
    rank = fields.get("rank", "?")
    signal = _SIGNAL.search(fields.get("exitcode", "") + " " + fields.get("traceback", ""))
    code = fields.get("exitcode", "?").split(" ")[0]
    return f"rank {rank}: {signal.group(1) if signal else f'exit code {code}'}"


def _last_words(lines: list[str]) -> str | None:
    """The last line a rank printed before torchrun's report, skipping torch's log lines."""
    for line in reversed(lines):
        if not _LOG_LINE.match(line) and not line.startswith((" ", "\t")):
            return _without_module(line)
    return None


def _without_module(line: str) -> str:
    """`torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: ...` ->
    `RendezvousConnectionError: ...` (the class says enough; the path costs the line)."""
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b)", r"\1", line)


def _short(text: str | None) -> str | None:
    if not text:
        return None
    text = " ".join(text.split())
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."
