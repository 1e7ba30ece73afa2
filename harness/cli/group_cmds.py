"""The group forms of run | logs | status | cancel | sync | build | doctor (logic: harness.multinode).

These are not commands of their own: each host command calls the function here when its HOST
argument names a `[groups.NAME]` instead of a host, so `harness run cluster train` and
`harness run gpu1 train` read the same.
"""

from __future__ import annotations

import sys

import click


def is_group(app, name: str) -> bool:
    return name in app.config.groups


def dispatch_if_group(ctx: click.Context, name: str, handler: str, *args) -> None:
    """When NAME is a group, run the group form of the command (function `handler` of this
    module) and exit with its code; for a host, return and let the host command go on."""
    app = ctx.obj
    if not is_group(app, name):
        return
    try:
        code = globals()[handler](app, name, *args)
    finally:
        app.close()
    ctx.exit(code)


def _group_run(app, group: str):
    from harness.multinode import GroupRun

    return GroupRun(app.config, group, app.transport)


def _hint(group: str, run_id: str) -> str:
    return f"re-attach: harness logs {group} {run_id} -f    status: harness status {group} {run_id}    stop: harness cancel {group} {run_id}"


# ---------------------------------------------------------------------------------------------
# run / logs / status / cancel


def run_group(app, group: str, stages: list[str], detach: bool, grace: float) -> int:
    from harness.cli.render import print_group_table
    from harness.multinode import prefixed_writer

    runner = _group_run(app, group)
    launch = runner.start(stages, grace_s=grace)
    click.echo(f"run {launch.run_id} started on {group} ({', '.join(launch.hosts)}; rendezvous {launch.endpoint})", err=True)
    click.echo(launch.run_id)
    if detach:
        click.echo(_hint(group, launch.run_id), err=True)
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
        click.echo(_hint(group, launch.run_id), err=True)
        return 130
    for t in threads:
        t.join(timeout=5)  # the tail of each log; a lost node's stream may never end
    print_group_table(status)
    return 0 if status.state == "ok" else 1


def logs_group(app, group: str, run_id: str, stage: str | None, follow: bool) -> int:
    from harness.multinode import prefixed_writer

    runner = _group_run(app, group)
    threads = runner.follow(run_id, prefixed_writer(), stage=stage, follow=follow)
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        return 130
    return 0


def status_group(app, group: str, run_id: str | None) -> int:
    from harness.cli.render import print_group_table

    status = _group_run(app, group).status(run_id or "last")
    origin = status.origin()
    if origin is not None:
        status.first_failure = f"{origin.host}: {origin.failure()}"
    print_group_table(status)
    return 0 if status.state in ("ok", "running") else 1


def cancel_group(app, group: str, run_id: str, grace: float | None) -> int:
    runner = _group_run(app, group)
    rid = runner.resolve_run_id(run_id)
    states = runner.cancel(rid, grace)
    for host, state in states.items():
        click.echo(f"run {rid} on {host}: {state}")
    return 1 if any(s.startswith("error") for s in states.values()) else 0


def runs_group(app, group: str) -> int:
    """Every host's runs, asked in parallel, as one table: a group run shares its id across hosts."""
    from rich.console import Console
    from rich.table import Table

    from harness.cli.render import plain, styled_state
    from harness.multinode import parallel

    runner = _group_run(app, group)
    listed = {h: (runs, error) for h, runs, error in parallel(runner.hosts, lambda h: runner.jobs(h).list_runs())}
    states: dict[str, dict[str, str]] = {}
    for host, (runs, error) in listed.items():
        for r in runs or []:
            states.setdefault(r.run_id, {})[host] = r.state
    table = Table(title=f"runs on group {plain(group)}")
    table.add_column("run", no_wrap=True)
    for host in runner.hosts:
        table.add_column(plain(host) + (" (unreachable)" if listed[host][1] is not None else ""))
    for run_id in sorted(states):
        table.add_row(plain(run_id), *(styled_state(states[run_id][h]) if h in states[run_id] else ("?" if listed[h][1] is not None else "-") for h in runner.hosts))
    Console().print(table)
    for host, (_, error) in listed.items():
        if error is not None:
            click.echo(f"{host}: {type(error).__name__}: {error}", err=True)
    return 1 if any(error is not None for _, error in listed.values()) else 0


# ---------------------------------------------------------------------------------------------
# sync / build / doctor: the same per-host work on every host at once


def sync_group(app, group: str, paths: list[str], dry_run: bool) -> int:
    """Every host of the group at once: one progress bar per host."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from harness.cli.transfer_cmds import _print_plan, _print_summary
    from harness.multinode import open_all, sync_hosts
    from harness.sync import SyncResult, manifest_digest, prepare_sync

    config = app.config
    hosts = list(config.groups[group].hosts)
    transports = open_all(app.transport, hosts)
    if dry_run:
        for h in hosts:
            plan = prepare_sync(transports[h], config.root, paths, config.host(h).workdir, exclude=config.sync.exclude, python=config.host(h).python)
            _print_plan(h, SyncResult(plan=plan, dry_run=True, manifest_digest=manifest_digest(plan.manifest)))
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
            _print_summary(h, result)
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
    """Every host's checks (in parallel), then the group's own: is the rendezvous port (and the
    watchdog's, +1) free on host 0, and can every node route to the rendezvous host."""
    from harness.cli.doctor_cmds import _render
    from harness.doctor import diagnose
    from harness.multinode import parallel

    config = app.config
    hosts = list(config.groups[group].hosts)
    outcome = parallel(hosts, lambda h: diagnose(config.host(h), lambda h=h: app.transport(h), project=config))
    results = {h: (r if e is None else []) for h, r, e in outcome}
    errors = {h: e for h, _, e in outcome if e is not None}
    group_checks = group_checks_for(app, group) if not errors else []
    failed = bool(errors) or any(r.status == "fail" for rs in [*results.values(), group_checks] for r in rs)
    if as_json:
        import json

        click.echo(json.dumps({
            "group": group, "ok": not failed,
            "hosts": {h: {"checks": [r.to_dict() for r in results[h]], **({"error": str(errors[h])} if h in errors else {})} for h in hosts},
            "group_checks": [c.to_dict() for c in group_checks],
        }, indent=2))
        return 1 if failed else 0
    for h in hosts:
        if h in errors:
            click.echo(f"{h}: doctor failed: {errors[h]}", err=True)
        else:
            _render(h, results[h])
    _render(f"group {group}", group_checks)
    return 1 if failed else 0


ROUTE_PROBE = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.getsockname()[0])\n"
    "except OSError as e:\n"
    "    print('no route: %s' % e); sys.exit(1)\n"
)


def group_checks_for(app, group: str):
    """CheckResults of the group as a whole (no packet is sent: a UDP connect only routes)."""
    from harness.doctor.base import CheckResult
    from harness.multinode import GroupRun, parallel

    runner = GroupRun(app.config, group, app.transport, install=False)  # doctor writes nothing
    cfg = runner.group
    host = runner.rendezvous_host()
    checks = []
    try:
        port = runner.free_port()
        if port == cfg.rdzv_port:
            checks.append(CheckResult("rendezvous port", "ok", f"{host}:{port} and {port + 1} are free on {runner.hosts[0]}"))
        else:
            checks.append(CheckResult("rendezvous port", "warn", f"{cfg.rdzv_port} or {cfg.rdzv_port + 1} is taken on {runner.hosts[0]}; a run would use {port}",
                                      f"free the port, or set rdzv_port in [groups.{group}]"))
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        checks.append(CheckResult("rendezvous port", "fail", f"cannot probe ports on {runner.hosts[0]}: {e}", "check python3 on that host"))

    def route(h: str):
        return runner.transports[h].run([app.config.host(h).python, "-c", ROUTE_PROBE, host, str(cfg.rdzv_port)])

    for h, result, error in parallel(runner.hosts, route):
        if error is None and result.ok:
            checks.append(CheckResult(f"route {h} -> {host}", "ok", f"via local address {result.text.strip()}"))
        else:
            why = str(error) if error else (result.text or result.stderr.decode("utf-8", "replace")).strip()
            checks.append(CheckResult(f"route {h} -> {host}", "fail", why, f"set rdzv_host in [groups.{group}] to an address every node can reach"))
    return checks
