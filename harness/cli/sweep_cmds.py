"""`harness sweep HOST` (the logic lives in harness.sweep; docs/sweep.md)."""

from __future__ import annotations

import click

JSON_HELP = "Print the sweep as JSON on stdout (with --status or --detach at once, else when it is done)."


def _gpu_list(text: str | None) -> list[int]:
    from harness.errors import UsageError

    if not text:
        return []
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected GPU indices like 0,1,2") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {text!r}: expected distinct GPU indices >= 0")
    return gpus


@click.command("sweep")
@click.argument("host")
@click.option("--set", "sets", multiple=True, metavar="train.FLAG=V1,V2", help="An axis of the grid (repeatable; over [sweep.grid.train]): e.g. --set train.lr=1e-3,3e-4 --set train.epochs=5,10.")
@click.option("--split", default=None, help="The rows each trial is measured on (default: [sweep] split, \"selection\").")
@click.option("--gpus", default=None, metavar="0,1,...", help="The GPUs trials spread over, one trial per GPU at a time (default: [sweep] gpus, else the host's).")
@click.option("--per-gpu", type=int, default=None, metavar="N", help="Trials at once on each GPU (default: [sweep] per_gpu, 1).")
@click.option("--status", "show", is_flag=True, help="Show the sweep once (the newest, or --id) and start nothing.")
@click.option("--id", "sid", default=None, metavar="SWEEP", help="With --status: this sweep (as `harness sweep` printed).")
@click.option("--detach", "-d", is_flag=True, help="Start (or pick up) the sweep and return at once.")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def sweep(ctx: click.Context, host: str, sets: tuple[str, ...], split: str | None, gpus: str | None, per_gpu: int | None, show: bool, sid: str | None, detach: bool, as_json: bool) -> None:
    """Train a grid of recipes on HOST as queued runs (train + evaluate, one GPU each), on the
    prepared data and hidden states of an earlier run; measure each on the selection split;
    print the winner as harness.toml lines, and its tau on the test split.

    Running the same command again picks the sweep up (its state is on the host). Ctrl-C
    detaches; `harness cancel HOST SWEEP` stops every trial.
    """
    from harness.cli.render import print_json
    from harness.sweep import Sweep

    sw = Sweep(ctx.obj.host(host))
    if show:
        view = sw.view(sw.load(sid))
        _print(view, as_json)
        ctx.exit(view.exit_code())
    state, lines = sw.start(sw.axes(list(sets)), split, _gpu_list(gpus), per_gpu)
    click.echo(f"sweep {state.sweep_id} on {host}: {len(state.trials)} trials", err=True)
    for line in lines:
        click.echo(line, err=True)
    if not as_json:
        click.echo(state.sweep_id)  # stdout: the id alone, for scripts (--json: its sweep_id)
    if detach:
        if as_json:
            print_json(sw.view(state).to_json())
        click.echo(f"see it: harness sweep {host} --status --id {state.sweep_id}", err=True)
        ctx.exit(0)
    try:
        view = _follow(sw, state.sweep_id, live=not as_json)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from sweep {state.sweep_id}; its runs go on on {host}. Pick it up: the same command again.", err=True)
        ctx.exit(130)
    _print(view, as_json)
    ctx.exit(view.exit_code())


def _print(view, as_json: bool) -> None:
    from harness.cli.render import print_json, print_sweep

    if as_json:
        print_json(view.to_json())
    else:
        print_sweep(view)


def _follow(sw, sid: str, live: bool):
    """Follow the sweep to its end (harness.sweep.Sweep.follow: it starts what is due, the test
    run); a live table meanwhile."""
    from rich.console import Console
    from rich.live import Live

    from harness.cli.render import sweep_table

    views = sw.follow(sid, on_line=lambda line: click.echo(line, err=True))
    view = next(views)
    if not live:
        for view in views:
            pass
        return view
    with Live(sweep_table(view), console=Console(stderr=True), refresh_per_second=2, transient=True) as screen:
        for view in views:
            screen.update(sweep_table(view))
    return view
