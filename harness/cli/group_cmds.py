"""The group forms of sync | build | doctor (logic: harness.multinode, harness.doctor).

These are not commands of their own: each host command calls the function here when its HOST
argument names a `[groups.NAME]` (the context's place(NAME) is a harness.host.Group), so
`harness sync cluster` and `harness sync gpu1` read the same. (run, logs, status, runs and cancel
need no group form: a group's GroupRun and a host's Jobs share one run interface,
harness.runs.RunPlace.) This module imports no other command module, only cli/render.py.
"""

from __future__ import annotations

import sys

import click


# ---------------------------------------------------------------------------------------------
# sync / build / doctor: the same per-host work on every host at once


def sync_group(group, paths: list[str], dry_run: bool) -> int:
    """Every host of the group at once: one progress bar per host."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from harness.cli.render import print_sync_plan, print_sync_summary
    from harness.multinode import open_all, sync_hosts
    from harness.sync import SyncResult, manifest_digest, prepare_sync

    config = group.config
    hosts = [h.name for h in group.hosts]
    transports = open_all(group.transport_for, hosts)
    if dry_run:
        for h in hosts:
            plan = prepare_sync(transports[h], config.root, paths, config.host(h).workdir, exclude=config.sync.exclude, python=config.host(h).python)
            print_sync_plan(h, SyncResult(plan=plan, dry_run=True, manifest_digest=manifest_digest(plan.manifest)))
        return 0
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(),
                        TextColumn("{task.fields[files]}"), console=Console(stderr=True))
    tasks: dict[str, tuple] = {}

    def on_plan(h: str, plan) -> None:
        tasks[h] = (progress.add_task(f"sync {h}", total=max(1, plan.upload_bytes), files=f"0/{len(plan.upload)} files"), plan)

    def progress_for(h: str):
        task, plan = tasks[h]

        def update(files: int, sent: int) -> None:
            progress.update(task, completed=min(sent, plan.upload_bytes), files=f"{files}/{len(plan.upload)} files")

        return update

    with progress:
        outcome = sync_hosts(config, transports, paths, on_plan=on_plan, progress_for=progress_for)
        for task, plan in tasks.values():
            progress.update(task, completed=max(1, plan.upload_bytes))
    failed = 0
    for h, result, error in outcome:
        if error is not None:
            failed += 1
            click.echo(f"{h}: sync failed: {error}", err=True)
        else:
            print_sync_summary(h, result)
    return 1 if failed else 0


def build_group(group, force: bool) -> int:
    from harness.errors import UsageError
    from harness.multinode import LinePrefixer, open_all, parallel, prefixed_writer
    from harness.runtime.image import build as build_image

    config = group.config
    hosts = [h.name for h in group.hosts]
    no_image = [h.name for h in group.hosts if not h.uses_image]
    if no_image:
        raise UsageError(f"group {group.name}: host(s) {', '.join(no_image)} have runtime = \"host\"; nothing to build there")
    transports = open_all(group.transport_for, hosts)
    write = prefixed_writer(sys.stderr.buffer)

    def one(h: str):
        out = LinePrefixer(h, write)
        try:
            return build_image(transports[h], config, config.host(h), output=out.feed, force=force)
        finally:
            out.flush()

    failed = 0
    for h, result, error in parallel(hosts, one):
        if error is not None:
            failed += 1
            click.echo(f"{h}: build failed: {error}", err=True)
        else:
            click.echo(f"{h}: {'built' if result.built else 'unchanged, not rebuilt'}: {result.ref} {result.image_id}")
    return 1 if failed else 0


def doctor_group(group, as_json: bool) -> int:
    """Every host's checks (in parallel), then the group's own (harness.doctor.group_checks)."""
    from harness.cli.render import print_checks, print_json
    from harness.doctor.group_checks import diagnose_group

    diagnosis = diagnose_group(group.config, group.name, group.transport_for)
    if as_json:
        print_json(diagnosis.to_json())
        return 0 if diagnosis.ok else 1
    for h in diagnosis.hosts:
        if h in diagnosis.errors:
            click.echo(f"{h}: doctor failed: {diagnosis.errors[h]}", err=True)
        else:
            print_checks(h, diagnosis.results[h])
    print_checks(f"group {group.name}", diagnosis.group_checks)
    return 0 if diagnosis.ok else 1
