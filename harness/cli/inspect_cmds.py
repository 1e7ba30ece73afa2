"""`harness inspect HOST DOTTED.PATH...` and `harness inspect HOST --grep PATTERN PACKAGE`
(the logic lives in harness.inspect_remote; this module parses and renders).

On a terminal: a header (what it is, file:lines, dist==version, decorators and unwrapped
wrappers) and the source highlighted with its real line numbers. Piped: the same, plain, so
`| grep`, `| less` and redirects get text. `--json` prints the full answer.
"""

from __future__ import annotations

import dataclasses
import json
import os

import click

from harness.cli.params import host_argument

@click.command("inspect")
@host_argument()
@click.argument("paths", nargs=-1, metavar="[DOTTED.PATH]...")
@click.option("--signature", "show", flag_value="signature", help="Only the call signature.")
@click.option("--doc", "show", flag_value="doc", help="Only the docstring.")
@click.option("--mro", "show", flag_value="mro", help="The method resolution order of a class.")
@click.option("--where", "show", flag_value="where", help="Only file:line.")
@click.option("--json", "as_json", is_flag=True, help="The full answer as JSON.")
@click.option("--import", "live", is_flag=True, help="Import and unwrap the live object even when reading the file would do (slower: imports torch; sees wrappers, monkeypatches).")
@click.option("--grep", "grep", nargs=2, metavar="PATTERN PACKAGE", default=None, help="Search the package's installed .py files for a regular expression.")
@click.option("-i", "--ignore-case", is_flag=True, help="With --grep: case-insensitive.")
@click.option("-C", "--context", type=click.IntRange(0, 20), default=1, show_default=True, help="With --grep: lines of context around each hit.")
@click.pass_context
def inspect(ctx: click.Context, host: str, paths: tuple[str, ...], show: str | None, as_json: bool, live: bool, grep: tuple[str, str] | None, ignore_case: bool, context: int) -> None:
    """Show the source of DOTTED.PATH as HOST's stage interpreter sees it (in its container
    when runtime = "docker"): real line numbers, file, and the installed version.

    \b
    harness inspect gpu speculators.models.eagle3.core.Eagle3DraftModel.forward
    harness inspect gpu torch.nn.attention.flex_attention.create_block_mask --signature
    harness inspect gpu transformers.LlamaConfig --mro
    harness inspect gpu --grep create_block_mask speculators

    A name bound by a plain def/class is read from its file without importing anything
    (decorators are listed as written); anything else is imported and unwrapped
    (functools.wraps, torch.compile, partial, staticmethod, property), and says so.
    """
    from harness.errors import UsageError
    from harness.inspect_remote import RemoteImportError, grep_package, inspect_objects

    if grep and paths:
        raise UsageError("give either dotted paths or --grep PATTERN PACKAGE, not both")
    if not grep and not paths:
        raise UsageError("expected a dotted path (e.g. torch.nn.functional.scaled_dot_product_attention) or --grep PATTERN PACKAGE")
    h = ctx.obj.host(host)
    transport, runtime = h.transport, h.runtime
    if grep:
        result = grep_package(transport, runtime, grep[0], grep[1], ignore_case=ignore_case, context=context)
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(result), indent=2))
        else:
            render_grep(result, ignore_case, context)
        ctx.exit(0 if result.hits else 1)  # like grep: 1 when nothing matched
    try:
        infos = inspect_objects(transport, runtime, list(paths), mode="import" if live else "auto", mro=show == "mro")
    except RemoteImportError as e:
        # The one-line error names the last frame; the frames before it say how we got there.
        click.echo("remote traceback (most recent call last):", err=True)
        for frame in e.frames:
            click.echo(f"  {frame}", err=True)
        raise
    if as_json:
        answers = [dataclasses.asdict(i) for i in infos]
        click.echo(json.dumps(answers[0] if len(answers) == 1 else answers, indent=2))
        return
    for n, info in enumerate(infos):
        if n and show is None:
            click.echo()  # a blank line between full listings; one-line modes stay one per line
        render_object(info, show)


# ---------------------------------------------------------------------------------------------
# Rendering


def _console():
    from rich.console import Console

    # highlight=False: rich must not recolor numbers and paths inside plain lines on its own
    return Console(highlight=False, soft_wrap=True)


def render_object(info, show: str | None) -> None:
    if show == "where":
        click.echo(f"{info.file}:{info.first_line}" if info.file and info.first_line else info.where)
        return
    if show == "signature":
        click.echo(f"{info.qualname or info.path}{info.signature or '(...)  # no signature available'}")
        return
    if show == "doc":
        click.echo(info.doc or f"{info.path}: no docstring")
        return
    if show == "mro":
        for name in info.class_mro or []:
            click.echo(name)
        return
    console = _console()
    from harness.cli.render import plain

    title, *details = header_lines(info)
    console.print(f"[bold]{plain(title)}[/bold]")
    for line in details:
        console.print(f"[dim]{plain(line)}[/dim]")
    if info.source is not None:
        console.print()
        if console.is_terminal:
            from rich.syntax import Syntax

            console.print(Syntax(info.source.rstrip("\n"), "python", line_numbers=True, start_line=info.first_line or 1, theme="ansi_dark", word_wrap=False))
        else:
            click.echo(numbered(info.source, info.first_line or 1))
        return
    # No Python source: compiled code, or a value.
    console.print()
    if info.signature:
        click.echo(f"signature: {info.qualname or info.path}{info.signature}")
    if info.value_repr is not None:
        click.echo(f"value: {info.value_repr}")
    if info.doc:
        click.echo()
        click.echo(info.doc)


def header_lines(info) -> list[str]:
    """What it is, where it lives, which distribution, and what stood between the name and the
    code (decorators as written, wrappers peeled off)."""
    what = "built-in function" if info.kind == "builtin" else info.kind
    if info.builtin:
        what += ": compiled, no Python source"
    title = f"{info.path}  ({what})"
    if info.qualname and info.module and not info.path.endswith(info.qualname):
        title += f"  = {info.module}.{info.qualname}"
    lines = [title]
    dist = str(info.dist) if info.dist else "no distribution found"
    lines.append(f"{info.where}  {dist}  python {info.python}")
    if info.type:
        lines.append(f"type: {info.type}")
    if info.decorators:
        lines.append("decorators (as written; --import unwraps the live object): " + ", ".join("@" + d for d in info.decorators))
    for step in info.unwrapped:
        at = f" defined at {step.where}" if step.where else ""
        lines.append(f"unwrapped {step.how}: {step.wrapper}{at}")
    if info.resolution == "static" and not info.decorators:
        lines.append("read from the file without importing (--import for the live object)")
    return lines


def numbered(source: str, first_line: int) -> str:
    lines = source.rstrip("\n").split("\n")
    width = len(str(first_line + len(lines) - 1))
    return "\n".join(f"{first_line + i:>{width}}  {line}" for i, line in enumerate(lines))


def render_grep(result, ignore_case: bool = False, context: int = 1) -> None:
    """grep -n -C style: `file:line:text` for hits, `file-line-text` for context, `--` between
    separate blocks (none with -C 0, like grep); paths relative to the directory that holds the package. The summary goes
    to stderr, so piped output is exactly the hit lines."""
    import re

    from rich.text import Text

    console = _console()
    color = console.is_terminal
    bases = [os.path.dirname(r.rstrip("/")) for r in result.roots]

    def rel(path: str) -> str:
        for base in bases:
            if path.startswith(base + "/"):
                return path[len(base) + 1:]
        return path

    # file -> line -> (text, is_hit); context lines shared by neighbouring hits appear once
    blocks: dict[str, dict[int, tuple[str, bool]]] = {}
    for hit in result.hits:
        lines = blocks.setdefault(rel(hit.file), {})
        for i, text in enumerate(hit.before):
            lines.setdefault(hit.line - len(hit.before) + i, (text, False))
        lines[hit.line] = (hit.text, True)
        for i, text in enumerate(hit.after):
            lines.setdefault(hit.line + 1 + i, (text, False))
    regex = re.compile(result.pattern, re.IGNORECASE if ignore_case else 0)
    previous: tuple[str, int] | None = None
    for file, lines in blocks.items():
        for number in sorted(lines):
            text, is_hit = lines[number]
            if context and previous is not None and previous != (file, number - 1):
                _emit(console, "--", color, "dim")
            previous = (file, number)
            if not is_hit:
                _emit(console, f"{file}-{number}-{text}", color, "dim")
            elif color:
                # Styled spans on a Text, not markup: a source line is arbitrary text
                # (brackets, backslashes before a match) and must print exactly as written.
                body = Text(text)
                for m in regex.finditer(text):
                    body.stylize("bold red", m.start(), m.end())
                console.print(Text.assemble((file, "magenta"), ":", (str(number), "green"), ":", body))
            else:
                click.echo(f"{file}:{number}:{text}")
    dist = f" ({result.dist})" if result.dist else ""
    files = len(blocks)
    summary = f"{len(result.hits)} hit{'s' if len(result.hits) != 1 else ''} in {files} of {result.files_searched} files of {result.package}{dist} under {', '.join(bases)}"
    if result.truncated:
        summary += " (truncated: more hits not shown)"
    click.echo(summary, err=True)


def _emit(console, text: str, color: bool, style: str) -> None:
    if color:
        from harness.cli.render import plain

        console.print(f"[{style}]{plain(text)}[/{style}]")
    else:
        click.echo(text)
