"""`harness forward HOST REMOTE_PORT[:LOCAL_PORT]...` and `harness tensorboard HOST [RUN]`
(the logic lives in harness.port_forward and harness.tensorboard)."""

from __future__ import annotations

import click

from harness.cli.params import complete_runs, host_argument


def _hold(forwarding, lines: list[str], server=None) -> None:
    """Print where each forward is reached (lines), then stay until Ctrl-C (or the connection ends).
    With `server` (the harness.host_server.HostServer behind a RelayForwarding): until it ends
    too, and then its error (a link that stalled: its connection's keepalive ended it)."""
    try:  # from the first URL on, Ctrl-C is the normal end
        for line in lines:
            click.echo(line)
        click.echo("forwarding; Ctrl-C to stop", err=True)
        if server is None:
            forwarding.wait()
        else:
            while not forwarding.wait(timeout=1.0):
                if not server.alive():
                    raise server.ended()
    except KeyboardInterrupt:
        click.echo("harness: forwarding stopped", err=True)
    finally:
        forwarding.close()


@click.command("forward")
@host_argument()
@click.argument("ports", nargs=-1, required=True, metavar="REMOTE_PORT[:LOCAL_PORT]...")
@click.pass_context
def forward(ctx: click.Context, host: str, ports: tuple[str, ...]) -> None:
    """Forward ports of HOST to this machine's loopback and stay until Ctrl-C.

    Ports where a container listens (runtime = "docker") are found and forwarded the same way.
    """
    from harness.port_forward import PortSpec, open_forwards

    h = ctx.obj.host(host)
    specs = [PortSpec.parse(p) for p in ports]
    forwarding, shown = open_forwards(h.transport, h.cfg.python, specs)
    for f in shown:
        if not f.listening:
            click.echo(f"harness: warning: nothing listens on port {f.spec.remote_port} of {host} yet; "
                       "the forward stays open for when something does", err=True)
    _hold(forwarding, [f"{f.url}  ->  port {f.spec.remote_port} of {host}" + (f" ({f.where})" if f.where and f.where != "the host" else "")
                       for f in shown])


@click.command("tensorboard")
@host_argument()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=complete_runs)
@click.option("--port", type=int, default=6006, show_default=True, help="Port on this machine.")
@click.pass_context
def tensorboard(ctx: click.Context, host: str, run: str | None, port: int) -> None:
    """Start TensorBoard on HOST over RUN's training logs (RUN: a run id or `last`; default: every
    run of the configured pipeline) where the stages run, forward it, and stop it on Ctrl-C.

    On the host it listens on a unix socket only its owner reaches, never on a TCP port.
    """
    from harness.port_forward import PortSpec
    from harness.relay_forward import RelayForwarding
    from harness.tensorboard import TensorBoardOptions, start

    h = ctx.obj.host(host)
    local_port = PortSpec.parse(str(port)).local_port
    run_id = h.jobs.resolve_run_id(run) if run else None
    board, logdir = start(h, TensorBoardOptions(run_id=run_id))
    with board:
        click.echo(f"TensorBoard on {host} over {logdir}", err=True)
        forwarding = RelayForwarding(h.transport, board.relay(), local_port)
        where = f" (container {board.container})" if board.container else ""
        _hold(forwarding, [f"http://127.0.0.1:{forwarding.addresses[0][1]}  ->  TensorBoard's socket on {host}{where}"], server=board)
