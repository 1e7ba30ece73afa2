"""The group forms of run | sync | build | doctor (logic: harness.multinode, harness.doctor).

These are not commands of their own: each host command calls the function here when its HOST
argument names a `[groups.NAME]` instead of a host, so `harness run cluster train` and
`harness run gpu1 train` read the same. (logs, status, runs and cancel need no group form: a
group's GroupRun and a host's Jobs share one run interface, harness.runs.RunPlace.) This module
imports no other command module, only cli/render.py.
"""

from __future__ import annotations

import sys
from typing import Callable

import click


def is_group(app, name: str) -> bool:
    return name in app.config.groups


def dispatch_if_group(ctx: click.Context, name: str, group_form: Callable[..., int], *args) -> None:
    """When NAME is a group, run the group form of the command (`group_form(app, name, *args)`,
    a function of this module) and exit with its code; for a host, return and let the host
    command go on."""
    app = ctx.obj
    if not is_group(app, name):
        return
    try:
        code = group_form(app, name, *args)
    finally:
        app.close()
    ctx.exit(code)


def _group_run(app, group: str):
    from harness.multinode import GroupRun

    return GroupRun(app.config, group, app.transport)


# ---------------------------------------------------------------------------------------------
# run (logs, status, runs and cancel take a group through harness.runs.RunPlace: job_cmds)


def run_group(app, group: str, stages: list[str], detach: bool, grace: float) -> int:
    from harness.cli.render import print_group_table, reattach_hint
    from harness.multinode import prefixed_writer

    runner = _group_run(app, group)
    launch = runner.start(stages, grace_s=grace)
    click.echo(f"run {launch.run_id} started on {group} ({', '.join(launch.hosts)}; rendezvous {launch.endpoint})", err=True)
    click.echo(launch.run_id)
    if detach:
        click.echo(reattach_hint(group, launch.run_id), err=True)
        return 0
    threads = runner.follow(launch.run_id, prefixed_writer(), follow=True)
    announced = False

    def on_update(status) -> None:
        nonlocal announced
        if status.first_failure and not announced:
            announced = True
            click.echo(f"harness: node {status.first_failure}; stopping the other nodes", err=True)

    try:
        status = runner.watch(launch.run_id, on_update=on_update, grace_s=grace)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from run {launch.run_id}; it keeps running on {group} (each node's watchdog stops the rest if one fails).", err=True)
        click.echo(reattach_hint(group, launch.run_id), err=True)
        return 130
    for t in threads:
        t.join(timeout=5)  # the tail of each log; a lost node's stream may never end
    print_group_table(status)
    return 0 if status.state == "ok" else 1


# ---------------------------------------------------------------------------------------------
# sync / build / doctor: the same per-host work on every host at once


def sync_group(app, group: str, paths: list[str], dry_run: bool) -> int:
    """Every host of the group at once: one progress bar per host."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from harness.cli.render import print_sync_plan, print_sync_summary
    from harness.multinode import open_all, sync_hosts
    from harness.sync import SyncResult, manifest_digest, prepare_sync

    config = app.config
    hosts = list(config.groups[group].hosts)
    transports = open_all(app.transport, hosts)
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


def build_group(app, group: str, force: bool) -> int:
    from harness.errors import UsageError
    from harness.multinode import LinePrefixer, open_all, parallel, prefixed_writer
    from harness.runtime import runtime_for
    from harness.runtime.image import build as build_image

    config = app.config
    hosts = list(config.groups[group].hosts)
    no_image = [h for h in hosts if not runtime_for(config.host(h)).uses_image]
    if no_image:
        raise UsageError(f"group {group}: host(s) {', '.join(no_image)} have runtime = \"host\"; nothing to build there")
    transports = open_all(app.transport, hosts)
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


def doctor_group(app, group: str, as_json: bool) -> int:
    """Every host's checks (in parallel), then the group's own (harness.doctor.group_checks)."""
    from harness.cli.render import print_checks, print_json
    from harness.doctor.group_checks import diagnose_group

    diagnosis = diagnose_group(app.config, group, app.transport)
    if as_json:
        print_json(diagnosis.to_json())
        return 0 if diagnosis.ok else 1
    for h in diagnosis.hosts:
        if h in diagnosis.errors:
            click.echo(f"{h}: doctor failed: {diagnosis.errors[h]}", err=True)
        else:
            print_checks(h, diagnosis.results[h])
    print_checks(f"group {group}", diagnosis.group_checks)
    return 0 if diagnosis.ok else 1
