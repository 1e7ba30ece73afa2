"""The `preflight` request (`harness run --dry-run`): what a launch would check and find, writing
nothing. A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard
library only.
"""

from __future__ import annotations

import json
import os
import sys

if globals().get("__package__"):  # imported as harness.host_helpers.preflight (tests)
    from harness.host_helpers import run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files


def cmd_preflight(requires: list, space: str, data: str | None, verifier: str | None) -> int:
    """`harness run --dry-run`: what the launch would check (requires), the free space where the
    artifacts go, and what sizes the hidden states: the data's rows, the verifier's width and
    depth (its config.json). Prints one JSON document; writes nothing."""
    missing = [need["message"] for need in requires if not os.path.exists(os.path.expanduser(need["path"]))]
    at = os.path.expanduser(space)
    while at and not os.path.exists(at):
        at = os.path.dirname(at)
    free = None
    try:
        st = os.statvfs(at or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    rows = None
    if data and os.path.isfile(os.path.expanduser(data)):
        with open(os.path.expanduser(data), "rb") as f:
            rows = sum(1 for line in f if line.strip())
    width = depth = None
    config = run_files.read_json(os.path.join(os.path.expanduser(verifier), "config.json")) if verifier else None
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        width, depth = text.get("hidden_size"), text.get("num_hidden_layers")
    json.dump({"missing": missing, "free_bytes": free, "space_at": at, "data_rows": rows, "hidden_size": width, "num_layers": depth}, sys.stdout)
    sys.stdout.write("\n")
    return 0
