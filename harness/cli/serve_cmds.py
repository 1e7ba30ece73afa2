"""`harness serve HOST [RUN]` (the logic lives in harness.serve)."""

from __future__ import annotations

import click

from harness.cli.params import complete_runs, host_argument


@click.command("serve")
@host_argument()
@click.argument("run", metavar="[RUN]", required=False, default="last", shell_complete=complete_runs)
@click.option("--port", type=int, default=8000, show_default=True, help="Port on this machine (on the host vLLM listens on a unix socket of its own).")
@click.option("--start-timeout", type=float, default=1800.0, show_default=True, help="Seconds to wait for vLLM to load and listen.")
@click.option("--vllm-arg", "vllm_args", multiple=True, help="One more `vllm serve` argument, e.g. --vllm-arg=--max-model-len=8192 (repeatable).")
@click.pass_context
def serve(ctx: click.Context, host: str, run: str, port: int, start_timeout: float, vllm_args: tuple[str, ...]) -> None:
    """Serve RUN's exported draft (a run id or `last`, the default) with vLLM on HOST, where the
    stages run, reach it from a port here, show the served acceptance as it changes, and stop it
    on Ctrl-C."""
    import queue

    from harness.errors import EXIT_INTERRUPTED
    from harness.events import Finished, Message, Metric
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
    run_id = h.jobs.resolve_run_id(run)
    try:
        server, export = start(h, ServeRequest(run_id, port, start_timeout, vllm_args), on_event=show)
    except KeyboardInterrupt:  # while vLLM loaded: start() stopped it on the box
        click.echo(f"harness: stopped vllm serve on {host} before it was ready", err=True)
        ctx.exit(EXIT_INTERRUPTED)  # an interrupted command, not a served-and-stopped one
    with server:
        while not server.events.empty():  # what it said while vLLM loaded, before the URL
            show(server.events.get())
        url = server.url
        try:
            click.echo(f"{url}  ->  vllm serve on {host} ({server.where}): run {run_id}'s draft {export}")
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
