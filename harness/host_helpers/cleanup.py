"""The `gc` request, the host half of harness/cleanup.py (`harness rm`, `harness gc`): remove the
runs named, then every artifact no kept run made, reused or read. A companion of supervisor.py
(harness/host_helpers/__init__.py, COMPANIONS); standard library only.
"""

from __future__ import annotations

import json
import os
import sys

if globals().get("__package__"):  # imported as harness.host_helpers.cleanup (tests)
    from harness.host_helpers import artifact_store, run_files, wire
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import artifact_store
    import run_files
    import wire


def cmd_gc(runs_dir: str, stores: list, remove: list, dry_run: bool) -> int:
    """`harness rm` (the runs in `remove`) and `harness gc` (none): remove those runs, then every
    artifact of the stores that no kept run made, reused or read. Kept whatever it holds: an
    artifact being made (its lock held), and every artifact of a stage a queued or running run
    names (it may read one whose key is not known before its stage starts). Prints what went (or
    would go, with `dry_run`) as one JSON document."""
    workdir = os.path.dirname(os.path.abspath(runs_dir))
    runs = {}
    for name in wire.run_names(runs_dir):
        record = run_files.read_json(os.path.join(runs_dir, name, "run.json"))
        if isinstance(record, dict) and not os.path.islink(os.path.join(runs_dir, name)):
            runs[name] = record
    for run_id in remove:
        if run_id not in runs:
            print(f"no run {run_id} in {runs_dir}", file=sys.stderr)
            return 2
        if run_files.lock_is_held(os.path.join(runs_dir, run_id)):
            print(f"run {run_id} is {run_files.read_json(os.path.join(runs_dir, run_id, 'state.json'), {}).get('state')}: cancel it first", file=sys.stderr)
            return 3
    kept = {rid: record for rid, record in runs.items() if rid not in remove}
    named, reading = set(), set()  # (store, stage, key) kept runs name; (store, stage) a live run may read
    for rid, record in kept.items():
        root = record.get("store")
        for stage, entry in (record.get("artifacts") or {}).items():
            if isinstance(entry, dict):
                named.add((root, stage, entry.get("key")))
        if run_files.lock_is_held(os.path.join(runs_dir, rid)):
            reading |= {(root, stage) for stage in (record.get("recipes") or {})}
    roots = sorted({r for r in [*stores, *(record.get("store") for record in runs.values())] if isinstance(r, str) and safe_store(r)})
    answer = {"runs": [], "artifacts": [], "kept": 0, "kept_for_live_runs": 0, "kept_busy": 0, "bytes": 0, "dry_run": dry_run}
    for run_id in remove:
        answer["bytes"] += artifact_store.size_of(os.path.join(runs_dir, run_id))
        if not dry_run:
            artifact_store.remove_path(os.path.join(runs_dir, run_id))
        answer["runs"].append(run_id)
    for root in roots:
        store = artifact_store.Store(workdir, root)
        for stage, key in store.artifacts():
            if (root, stage, key) in named:
                answer["kept"] += 1
            elif (root, stage) in reading:
                answer["kept_for_live_runs"] += 1
            elif store.busy(stage, key):
                answer["kept_busy"] += 1
            else:
                freed = (artifact_store.size_of(store.dir(stage, key)) + artifact_store.size_of(store.dir(stage, key) + ".json")) if dry_run \
                    else store.remove(stage, key)
                if freed is None:
                    answer["kept_busy"] += 1
                    continue
                answer["artifacts"].append({"store": root, "stage": stage, "key": key, "bytes": freed,
                                            "complete": store.record(stage, key) is not None if dry_run else None})
                answer["bytes"] += freed
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0


def safe_store(root: str) -> bool:
    """A store as a record names it: relative to the workdir and below it, or absolute; no `..`."""
    return ".." not in root.split("/") and root not in ("", "/", ".")
