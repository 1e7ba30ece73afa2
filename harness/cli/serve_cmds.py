"""`harness serve HOST [RUN]` (the logic lives in harness.serve)."""

from __future__ import annotations

import click

from harness.cli.params import complete_runs, host_argument


@click.command("serve")
@host_argument()
@click.argument("run", metavar="[RUN]", required=False, default="last", shell_complete=complete_runs)
@click.option("--port", type=int, default=8000, show_default=True, help="vLLM's port on the host (on docker hosts, in its container).")
@click.option("--local-port", type=int, default=None, help="Port on this machine (default: the same).")
@click.option("--start-timeout", type=float, default=1800.0, show_default=True, help="Seconds to wait for vLLM to load and listen.")
@click.option("--vllm-arg", "vllm_args", multiple=True, help="One more `vllm serve` argument, e.g. --vllm-arg=--max-model-len=8192 (repeatable).")
@click.pass_context
def serve(ctx: click.Context, host: str, run: str, port: int, local_port: int | None, start_timeout: float, vllm_args: tuple[str, ...]) -> None:
    """Serve RUN's exported draft (a run id or `last`, the default) with vLLM on HOST, where the
    stages run, forward its port here, show the served acceptance as it changes, and stop it on
    Ctrl-C."""
    import queue

    from harness.events import Finished, Message, Metric
    from harness.port_forward import PortSpec
    from harness.serve import ServeRequest, served_line, start

    def show(event) -> None:
        if isinstance(event, Message):
            click.echo(f"{host}: {event.text}", err=True)
        elif isinstance(event, Metric):
            line = served_line(event)
            if line:
                click.echo(line)
        elif isinstance(event, Finished) and event.failed:
            click.echo(f"harness: error: {host}: {event.error}", err=True)

    h = ctx.obj.host(host)
    spec = PortSpec.parse(f"{port}:{local_port or port}")
    run_id = h.runs.resolve_run_id(run)
    try:
        server, export = start(h, ServeRequest(run_id, spec.remote_port, start_timeout, vllm_args), on_event=show)
    except KeyboardInterrupt:  # while vLLM loaded: start() stopped it on the box
        click.echo(f"harness: stopped vllm serve on {host} before it was ready", err=True)
        return
    with server:
        while not server.events.empty():  # what it said while vLLM loaded, before the URL
            show(server.events.get())
        forwarding, url, where = server.forward(h.cfg.python, spec)
        try:
            click.echo(f"{url}  ->  vllm serve on port {spec.remote_port} of {host}" + (f" ({where})" if where and where != "the host" else "")
                       + f": run {run_id}'s draft {export}")
            click.echo(f"its API key is in {server.key.path} (removed when this ends): "
                       f"curl -H \"Authorization: Bearer $(cat {server.key.path})\" {url}/v1/models")
            click.echo("serving; served acceptance below as requests come; Ctrl-C to stop", err=True)
            while server.alive():
                try:
                    show(server.events.get(timeout=1.0))
                except queue.Empty:
                    continue
            click.echo(f"harness: error: {host}: vllm serve ended: {server.failure()}", err=True)
            raise SystemExit(1)
        except KeyboardInterrupt:
            click.echo(f"harness: stopping vllm serve on {host}", err=True)
        finally:
            forwarding.close()
