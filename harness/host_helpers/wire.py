"""The wire contract: what the laptop and the host helpers must agree on, written once.

Standard library only, and no harness import: it travels ahead of every host helper (the loader,
harness/host_helpers/__init__.py source(), registers it as the module `wire`) and the laptop
imports it as harness.host_helpers.wire. Stage scripts (remote_scripts/) do not import it (only
remote_scripts/ is synced to the box): the two rules they share with it (hub id, target layers)
are held equal to it by tests/test_wire.py. Plain Python for any host python3 and stage python.
"""

import os
import struct

# Tokens in a request, put in on the host (the laptop never asks for these values):
HOME_TOKEN = "@harness-home@"  # the home directory (`~` of a launch request, Prefetched's commands)
USER_TOKEN = "@harness-user@"  # a stage container's --user: the box user's "uid:gid" (harness/runtime/docker.py)

# sync: the host's manifest of what sync put there, relative to the workdir
MANIFEST_PATH = ".harness/sync-manifest.json"
# sync's body: per file, its size (GONE: it vanished since the scan) and permission bits
SYNC_RECORD = struct.Struct(">QI")
SYNC_GONE = (1 << 64) - 1

# pull: each frame of pull_helper.py's `send` stdout is FRAME_HEADER (status, length) then length bytes
FRAME_HEADER = struct.Struct(">BQ")
FRAME_PIECE = 0  # bytes of the piece being sent
FRAME_CHANGED = 1  # the file changed (or vanished) during the pull: the piece is void
FRAME_CRC = 2  # the piece ends: its CRC-32 (PIECE_CRC)
FRAME_READY = 3  # the helper reads requests (its first frame), or the answer to a ping
FRAME_ANSWER = 4  # a question's answer (JSON, or a small file's bytes)
FRAME_ERROR = 5  # a question's error: {"error": why, "missing": bool}
FRAME_LISTENER = 6  # the listener for more streams ({} where it cannot listen)
PIECE_CRC = struct.Struct(">I")


def clean_rel(path):
    """path when it is a plain relative POSIX path (not empty, no NUL, not absolute, no empty,
    `.` or `..` component), else None: the one rule for a name that lands under a root, on
    either side (sync's scan and its apply on the host, pull's names from the host)."""
    if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
        return None
    if any(p in ("", ".", "..") for p in path.split("/")):
        return None
    return path


def run_names(runs_dir):
    """The run directories' names in runs_dir, oldest first (run ids sort by their start time):
    the order of the supervisor's status, in which `last` is the final one with a record."""
    return sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []


def is_hub_id(text):
    """Whether a verifier (or data) names a Hugging Face hub id, "org/name", rather than a path:
    one `/` between two non-empty parts, and not starting with `/`, `~` or `.` (a hub name never
    does). Everything else is a path (relative ones: under the workdir)."""
    return text.count("/") == 1 and not text.startswith(("/", "~", ".")) and all(text.split("/"))


def default_target_layers(num_layers):
    """speculators' default auxiliary layers (speculators.models.utils.resolve_target_layer_ids)."""
    return [2, num_layers // 2, num_layers - 3]


def newest_run(runs_dir):
    """The run `last` names in runs_dir: the id of the final run in run_names' order whose
    run.json holds a record (as the supervisor's status lists runs), or None."""
    import json

    for name in reversed(run_names(runs_dir)):
        try:
            with open(os.path.join(runs_dir, name, "run.json")) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record:
            return record.get("run_id") or name
    return None
