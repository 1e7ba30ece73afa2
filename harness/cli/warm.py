"""`harness [--config PATH] exec HOST [--] CMD...` recognised before click is imported: its plain
form goes to the warm exec (transport/warm_exec.py), which runs it from the recipe an earlier
exec of the same host and config left, or declines; anything else, errors included, is the
Click group's (cli/app.py), as is every exec the recipe cannot serve."""

from __future__ import annotations

import os


def run_warm_exec(argv: list[str]) -> int | None:
    """The exit code of a warm exec, or None: not one (the caller runs the Click group)."""
    call = parse(argv)
    if call is None:
        return None
    config_path, host, command = call
    from harness.transport import warm_exec

    return warm_exec.run(recipe_key(config_path, host), command)


def parse(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """(absolute config path, host, command) of the plain form, or None: `--config` is the only
    option before `exec`, none after it (no --pty), and the command either follows `--` or has
    no word starting with '-' (where click's reading of options would rule)."""
    config, i = "", 0
    if argv[:1] == ["--config"] and len(argv) > 1:
        config, i = argv[1], 2
    elif argv[:1] and argv[0].startswith("--config="):
        config, i = argv[0][len("--config="):], 1
    if argv[i:i + 1] != ["exec"] or len(argv) < i + 3 or (i and not config):
        return None
    host, command = argv[i + 1], argv[i + 2:]
    if host.startswith("-"):
        return None
    if command[0] == "--":
        command = command[1:]
    elif any(word.startswith("-") for word in command):
        return None
    if not command:
        return None
    from harness.config_discovery import ConfigNotFound, discover

    try:
        return config_file(discover(config or None)), host, command
    except ConfigNotFound:
        return None  # the Click group says why


def config_file(path: str | os.PathLike[str]) -> str:
    """The config file as both sides name it: its real path (harness.config resolves the loaded
    file's path: through a symlinked directory the warm side must name the same file)."""
    return os.path.realpath(path)


def recipe_key(config_path: str, host: str) -> str:
    """Names one host of one config file (config_file's form): the recipe's key (cli/exec_cmds.py
    writes under it)."""
    return f"{config_path}\0{host}"
