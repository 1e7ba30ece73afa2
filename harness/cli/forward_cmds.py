"""`harness forward HOST REMOTE_PORT[:LOCAL_PORT]...` and `harness tensorboard HOST [RUN]`
(the logic lives in harness.port_forward and harness.tensorboard)."""

from __future__ import annotations

import click


def _hold(forwarding, shown, host: str) -> None:
    """Print the URLs, then stay until Ctrl-C (or the connection ends)."""
    for f in shown:
        where = f"port {f.spec.remote_port} of {host}" + (f" ({f.where})" if f.where and f.where != "the host" else "")
        click.echo(f"{f.url}  ->  {where}")
    for f in shown:
        if not f.listening:
            click.echo(f"harness: warning: nothing listens on port {f.spec.remote_port} of {host} yet; "
                       "the forward stays open for when something does", err=True)
    click.echo("forwarding; Ctrl-C to stop", err=True)
    try:
        forwarding.wait()
    except KeyboardInterrupt:
        click.echo("harness: forwarding stopped", err=True)
    finally:
        forwarding.close()


@click.command("forward")
@click.argument("host")
@click.argument("ports", nargs=-1, required=True, metavar="REMOTE_PORT[:LOCAL_PORT]...")
@click.pass_context
def forward(ctx: click.Context, host: str, ports: tuple[str, ...]) -> None:
    """Forward ports of HOST to this machine's loopback and stay until Ctrl-C.

    Ports where a container listens (runtime = "docker") are found and forwarded the same way.
    """
    from harness.port_forward import PortSpec, open_forwards

    app = ctx.obj
    specs = [PortSpec.parse(p) for p in ports]
    try:
        forwarding, shown = open_forwards(app.transport(host), app.host(host).python, specs)
        _hold(forwarding, shown, host)
    finally:
        app.close()
