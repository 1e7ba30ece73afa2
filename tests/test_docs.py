"""The docs say what the commands do: docs/cli.md is what the Click commands say now, and every
`harness ...` line in a ```bash block of the README (and of docs/*.md, docs/architecture/*.md) is a
real command with real options and the arguments it needs (parsed by the commands' own Click
parser, nothing run). docs/ARCHITECTURE.md opens with the map, links every reference file, and its
glossary's stage list is the stage table."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from harness.cli.app import cli
from harness.cli.reference import render

REPO = Path(__file__).resolve().parents[1]


def test_docs_cli_md_is_what_the_commands_say():
    assert (REPO / "docs" / "cli.md").read_text() == render(), "docs/cli.md is stale: python -m harness.cli.reference > docs/cli.md"


def shell_commands(markdown: str) -> list[str]:
    """Each command of the ```bash blocks: continued lines joined, comments dropped, `&&` / `;`
    / `|` split."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in words + [";"]:
                if word in ("&&", "||", ";", "|"):
                    if command:
                        commands.append(shlex.join(command))
                    command = []
                else:
                    command.append(word)
    return commands


def harness_argv(command: str) -> list[str] | None:
    """The arguments after `harness` (or `.venv/bin/harness`), else None."""
    argv = shlex.split(command)
    return argv[1:] if argv and Path(argv[0]).name == "harness" else None


def check_harness_command(args: list[str]) -> None:
    """Parse ARGS as `harness` would, without running anything: a click error if they are wrong."""
    with cli.make_context("harness", list(args), resilient_parsing=False) as ctx:
        name, command, rest = cli.resolve_command(ctx, [*ctx._protected_args, *ctx.args])  # what Group.invoke hands on
        command.make_context(name, rest, parent=ctx).close()


def shown_commands(page: Path) -> list[list[str]]:
    return [argv for argv in map(harness_argv, shell_commands(page.read_text())) if argv is not None]


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "architecture").glob("*.md"))]
SHOWN = [(page.relative_to(REPO).as_posix(), args) for page in PAGES for args in shown_commands(page)]


def test_the_readme_shows_harness_commands():
    assert len(shown_commands(REPO / "README.md")) >= 8  # the first session, not an empty parse


@pytest.mark.parametrize("page, args", SHOWN, ids=[f"{page}: {' '.join(args)[:60]}" for page, args in SHOWN])
def test_every_command_the_docs_show_is_real(page, args):
    check_harness_command(args)


@pytest.mark.parametrize("args", [["sync"], ["run", "gpu", "all", "--no-such-option"], ["no-such-command", "gpu"], ["logs", "gpu", "last", "train", "extra"]])
def test_a_wrong_command_is_caught(args):
    from harness.errors import UsageError  # a command name harness itself refuses (with its nearest match)

    with pytest.raises((click.UsageError, UsageError)):
        check_harness_command(args)


def test_the_glossary_names_every_stage_and_no_other():
    """docs/ARCHITECTURE.md's "stage" entry lists the stages by name: the list is pipeline.STAGES."""
    from harness.pipeline import STAGES

    words = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## Words", 1)[1].split("\n## ", 1)[0]
    entry = re.search(r"- \*\*stage\*\*: one script of remote_scripts/ \(([^)]*)\)", words)
    assert entry, "the glossary has no stage entry"
    assert [name.strip() for name in entry.group(1).split(",")] == list(STAGES)


MAP_WORDS = 1500  # issue 57: a one-page map, not a manual


def test_the_architecture_page_opens_with_a_map_that_links_every_reference_file():
    """docs/ARCHITECTURE.md is a map (what comes before its glossary, at most MAP_WORDS words)
    that links each file of docs/architecture/, and every file it links is there."""
    page = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    map_part = page.split("\n## Words", 1)[0]
    assert len(map_part.split()) <= MAP_WORDS, f"the map has {len(map_part.split())} words"
    linked = set(re.findall(r"\]\(architecture/([\w.-]+\.md)\)", map_part))
    present = {p.name for p in (REPO / "docs" / "architecture").glob("*.md")}
    assert present and linked == present, f"not linked: {sorted(present - linked)}; missing: {sorted(linked - present)}"


def test_every_pointer_into_the_architecture_reference_names_a_file_there():
    """Code comments and docs say `docs/architecture/NAME.md`: each NAME is a file (a split or a
    rename of a reference file updates its pointers)."""
    named: dict[str, list[str]] = {}
    for path in [*REPO.glob("harness/**/*.py"), *REPO.glob("remote_scripts/**/*.py"), *REPO.glob("docs/**/*.md"), REPO / "README.md"]:
        for name in re.findall(r"docs/architecture/([\w.-]+\.md)", path.read_text(encoding="utf-8")):
            named.setdefault(name, []).append(path.relative_to(REPO).as_posix())
    assert named, "no pointer found: the pattern no longer matches the docs' form"
    missing = {name: where for name, where in named.items() if not (REPO / "docs" / "architecture" / name).is_file()}
    assert not missing, missing
