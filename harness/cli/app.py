"""The `harness` Click group: command names mapped to the modules that hold them, each imported
only when invoked, so `harness --help` stays fast (no SSH client, docker or rich import)."""

from __future__ import annotations

import importlib
import signal
import sys

import click

from harness.cli.exit_code import exit_with
from harness.errors import EXIT_INTERRUPTED, EXIT_USAGE, HarnessError, UsageError, did_you_mean

# command name -> "module:function" (each module holds one concept's commands)
COMMANDS: dict[str, str] = {
    "init": "harness.cli.config_cmds:init",
    "hosts": "harness.cli.config_cmds:hosts",
    "exec": "harness.cli.exec_cmds:exec_",
    "doctor": "harness.cli.doctor_cmds:doctor",
    "sync": "harness.cli.transfer_cmds:sync",
    "pull": "harness.cli.transfer_cmds:pull",
    "build": "harness.cli.container_cmds:build",
    "shell": "harness.cli.container_cmds:shell",
    "run": "harness.cli.job_cmds:run",
    "logs": "harness.cli.job_cmds:logs",
    "status": "harness.cli.job_cmds:status",
    "runs": "harness.cli.job_cmds:runs",
    "cancel": "harness.cli.job_cmds:cancel",
    "diff": "harness.cli.job_cmds:diff",
    "rm": "harness.cli.cleanup_cmds:rm",
    "gc": "harness.cli.cleanup_cmds:gc",
    "inspect": "harness.cli.inspect_cmds:inspect",
    "sources": "harness.cli.sources_cmds:sources",
    "check-extract": "harness.cli.extract_cmds:check_extract",
    "demo": "harness.cli.demo_cmds:demo",
    "forward": "harness.cli.forward_cmds:forward",
    "tensorboard": "harness.cli.forward_cmds:tensorboard",
    "serve": "harness.cli.serve_cmds:serve",
    "completion": "harness.cli.completion_cmds:completion",
    "sweep": "harness.cli.sweep_cmds:sweep",
}

HELP = {
    "init": "Write a commented starter harness.toml.",
    "hosts": "List configured hosts and groups.",
    "exec": "Run a command on a host (inside its container when runtime = docker).",
    "doctor": "Preflight checks for a host: ok / warn / fail, each with a fix.",
    "sync": "Push remote_scripts/, container/ and the config to a host, incrementally.",
    "pull": "Fetch run outputs from a host: resumable, verified, atomic.",
    "build": "Build the ML container image on a host from container/.",
    "shell": "Open an interactive shell in the container on a host.",
    "run": "Start pipeline stages on a host as a detached run.",
    "logs": "Show (and follow) the logs of a run.",
    "status": "Show the state of a run's stages.",
    "runs": "List the runs on a host.",
    "cancel": "Cancel a run: SIGTERM, grace period, SIGKILL.",
    "diff": "Two runs side by side: settings, artifacts, flags, code and environment, versions, tau.",
    "rm": "Remove runs from a host, and the artifacts no kept run needs.",
    "gc": "Remove the artifacts no run on a host needs (--dry-run: what and how much).",
    "inspect": "Show the source of a Python object as the remote container sees it.",
    "sources": "Mirror the Python sources of packages on a host for the laptop's editor (extraPaths).",
    "check-extract": "After a sharded extract: every sample has exactly one valid hidden-state file (host or group).",
    "demo": "Run the whole EAGLE-3 pipeline on this machine on a tiny verifier.",
    "forward": "Forward ports of a host (TensorBoard, vllm serve, Jupyter) to localhost until Ctrl-C.",
    "tensorboard": "Start TensorBoard on a host over a run's training logs and forward it.",
    "serve": "Serve a run's exported draft with vLLM on a host, forward it, show the served acceptance.",
    "completion": "Print the shell completion script (bash, zsh, fish): hosts, stages, run ids.",
    "sweep": "Train a grid of train recipes as queued runs, measure each on the selection split, print the winner.",
}


# Options of the whole command line, accepted before the subcommand and after it (`harness doctor
# gpu --accept-new-host-key`, as the host-key error suggests): each sets the invocation's AppContext.
GLOBAL_OPTIONS: list[tuple[list[str], str, dict]] = [
    (["--config", "config_path"], "config_path",
     {"type": click.Path(dir_okay=False), "default": None, "help": "Path to harness.toml (default: $HARNESS_CONFIG, else the first harness.toml in this directory or above)."}),
    (["--accept-new-host-key"], "accept_new_host_key",
     {"is_flag": True, "default": False, "help": "Trust an unknown SSH host key once and record it (a changed key is always refused)."}),
    (["-q", "--quiet"], "quiet",
     {"is_flag": True, "default": False, "help": "Quieter: no progress bars, docker's build output or re-attach hints on stderr (results and errors stay)."}),
]


def _set_global(attr: str):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value not in (None, False) and ctx.obj is not None:
            setattr(ctx.obj, attr, value)
        return value

    return callback


def global_params() -> list[click.Option]:
    """GLOBAL_OPTIONS as a subcommand's own options (not passed to its function)."""
    return [click.Option(decls[:1] if len(decls) == 2 and not decls[1].startswith("-") else decls, expose_value=False,
                         callback=_set_global(attr), **kw) for decls, attr, kw in GLOBAL_OPTIONS]


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not getattr(command, "_harness_globals", False):  # once per command object
            command.params.extend(global_params())
            command._harness_globals = True
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            if name == "help":  # what a person types for help is no typo of `shell`
                raise UsageError("no command 'help'", "`harness --help` lists the commands; `harness COMMAND --help` says what one takes")
            raise UsageError(f"no command {name!r}", did_you_mean(name, COMMANDS) or "`harness --help` lists the commands")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import every command module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, HELP.get(name, "")) for name in COMMANDS])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Options of the whole command (--config, --accept-new-host-key, -q) may also follow the command's name. "
                    "Exit codes: 0 ok, 1 failed, 2 bad input, 130 interrupted, 255 host unreachable (docs/troubleshooting.md).")
@click.option("--config", "config_path", **GLOBAL_OPTIONS[0][2])
@click.option("--accept-new-host-key", **GLOBAL_OPTIONS[1][2])
@click.option("-q", "--quiet", **GLOBAL_OPTIONS[2][2])
@click.version_option(package_name="harness")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, accept_new_host_key: bool, quiet: bool) -> None:
    """Drive EAGLE-3 draft-model training on a GPU host, safely and fast."""
    from harness.cli.context import AppContext  # deferred: start-up (the config and its parser: not for --help)

    ctx.obj = AppContext(config_path=config_path, accept_new_host_key=accept_new_host_key, quiet=quiet)
    ctx.call_on_close(ctx.obj.close)  # the one close: every connection a command opened


def usage_line(e: click.UsageError) -> str:
    """click's usage error (a missing argument, an unknown option) as harness's one line."""
    command = e.ctx.command_path if e.ctx is not None else "harness"
    message = e.format_message().rstrip(".")
    stage_flag = _stage_flag(e)
    if stage_flag:  # `harness run gpu train --epochs 5`: a flag of the stage, not of run
        message = f"no such option: {e.option_name}"
        hint = f"a stage's flag goes in --set {stage_flag}=VALUE (this run) or [pipeline.stages.{stage_flag.split('.')[0]}] (every run)"
    elif isinstance(e, click.NoSuchOption) and e.possibilities:
        hint = "did you mean " + " or ".join(e.possibilities) + "?"
        message = f"no such option: {e.option_name}"
    else:
        hint = f"`{command} --help` says what it takes"
    return f"harness: error: {message} ({hint})"


def _stage_flag(e: click.UsageError) -> str | None:
    """`STAGE.FLAG` when `harness run`'s unknown option is a flag of a stage it names (its
    script's parser, beside the config, says so)."""
    if not isinstance(e, click.NoSuchOption) or e.ctx is None or e.ctx.command.name != "run":
        return None
    from harness.stage_options import stage_options  # deferred: start-up (as is the table: dataclasses, argparse)
    from harness.stages import STAGES

    flag = e.option_name.lstrip("-").replace("-", "_")
    try:
        config = e.ctx.find_root().obj.config
    except (HarnessError, AttributeError):
        return None
    for stage in [a for a in sys.argv if a in STAGES]:
        if flag in (stage_options(config.path, STAGES[stage].script) or {}):
            return f"{stage}.{flag}"
    return None


def _interrupted(signum, frame) -> None:
    """SIGTERM (a terminal closed, a supervisor's stop) ends a command as Ctrl-C does: what it
    started stops, what it wrote here goes (serve's key file, a tunnel, a pull's part files)."""
    raise KeyboardInterrupt


def run() -> None:
    """Run the command line: typed HarnessErrors become one line and their exit code
    (harness.errors: EXIT_*)."""
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        rv = cli.main(standalone_mode=False, complete_var="_HARNESS_COMPLETE")  # the same under python -m harness
    except HarnessError as e:
        click.echo(f"harness: error: {e}", err=True)
        exit_with(e.exit_code)
    except click.exceptions.Abort:
        click.echo("harness: aborted", err=True)
        exit_with(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as e:  # `harness` (or a group) alone: its help
        click.echo(e.format_message(), err=True)
        exit_with(EXIT_USAGE)
    except click.UsageError as e:
        click.echo(usage_line(e), err=True)
        exit_with(EXIT_USAGE)
    except click.ClickException as e:
        click.echo(f"harness: error: {e.format_message()}", err=True)
        exit_with(e.exit_code)
    except click.exceptions.Exit as e:
        exit_with(e.exit_code)
    except KeyboardInterrupt:
        exit_with(EXIT_INTERRUPTED)
    # Commands signal their exit code with ctx.exit(code), which click returns here.
    exit_with(rv if isinstance(rv, int) else 0)
