"""`harness init` (a commented starter harness.toml: harness.starter) and `harness hosts` (what is configured)."""

from __future__ import annotations

import click


@click.command()
@click.option("--path", "path", type=click.Path(dir_okay=False), default=None, help="Where to write it (default: ./harness.toml, or --config).")
@click.option("--host", "host", default=None, help="The GPU box's name in harness (default: gpu).")
@click.option("--ssh", "ssh", default=None, help="How to reach it: user@host[:port] or an alias from ~/.ssh/config.")
@click.option("--runtime", type=click.Choice(["docker", "host"]), default=None, help="docker: stages run in the ML container (default); host: plain processes.")
@click.option("--workdir", default=None, help="Where harness keeps code, runs and outputs on the box (default: ~/harness).")
@click.option("--verifier", default=None, help="A Hugging Face model id, or a directory on the box (default: the demo's tiny verifier).")
@click.option("--data", default=None, help="Chat JSONL: a file under this directory (synced), or a path on the box.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.pass_obj
def init(app, path: str | None, host: str | None, ssh: str | None, runtime: str | None, workdir: str | None, verifier: str | None, data: str | None, force: bool) -> None:
    """Write a commented starter harness.toml beside remote_scripts/ and container/.

    On a terminal it asks for what the options leave out (offering your ~/.ssh/config aliases);
    otherwise (a script, stdin not a terminal) the options and the defaults make it, no question.
    Never overwrites a file unless --force.
    """
    import sys
    from pathlib import Path

    from harness.config_discovery import CONFIG_NAME
    from harness.starter import Answers, check_project, render, ssh_aliases, write_new

    target = Path(path or app.config_path or CONFIG_NAME)
    check_project(target.resolve().parent)
    given = {k: v for k, v in dict(host=host, ssh=ssh, runtime=runtime, workdir=workdir, verifier=verifier, data=data).items() if v is not None}
    answers = Answers(**given)
    if sys.stdin.isatty():
        answers = _ask(answers, given, ssh_aliases())
    write_new(target, render(answers, target.resolve().parent, Path.cwd()), force)
    click.echo(f"wrote {target}: next `harness doctor {answers.host}`, then `harness run {answers.host} demo` "
               f"(or a stage: `harness run {answers.host} prepare --dry-run`)")


def _ask(answers, given: dict, aliases: list[str]):
    """Prompt for each answer the options did not give."""
    import dataclasses

    asked = {}
    if "host" not in given:
        asked["host"] = click.prompt("Name of the GPU box in harness", default=answers.host)
    if "ssh" not in given:
        if aliases:
            click.echo("Hosts in ~/.ssh/config: " + ", ".join(f"[{i}] {a}" for i, a in enumerate(aliases, 1)))
        reply = click.prompt("SSH target (user@host[:port], an alias, or its number)", default=aliases[0] if aliases else answers.ssh)
        asked["ssh"] = aliases[int(reply) - 1] if reply.isdigit() and 0 < int(reply) <= len(aliases) else reply
    if "runtime" not in given:
        asked["runtime"] = click.prompt("Runtime", type=click.Choice(["docker", "host"]), default=answers.runtime)
    if "verifier" not in given:
        asked["verifier"] = click.prompt("Verifier (hub id org/name, or a directory on the box)", default=answers.verifier)
    if "data" not in given:
        asked["data"] = click.prompt("Chat data (JSONL: a file under this directory, or a path on the box)", default=answers.data)
    return dataclasses.replace(answers, **asked)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the hosts and groups as JSON on stdout (keys: docs/json.md).")
@click.pass_obj
def hosts(app, as_json: bool) -> None:
    """List configured hosts and groups."""
    from harness.cli.render import print_hosts, print_json

    if as_json:
        print_json(app.config.hosts_json())
    else:
        print_hosts(app.config)
