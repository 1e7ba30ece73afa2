"""The README's first session on your own box, typed into a real terminal as a person types it.

A tmux server of the test's own runs bash; the test types `harness init`, edits the starter
harness.toml as one would in an editor (the box is the test bed's sshd, `runtime = "host"`), then
`harness sync`, an attached `harness run` (the screen shows the stages' progress bars), `harness
status`, `harness logs -f` and Ctrl-C (the screen says it detached; the run goes on), and `harness
pull`, reading the screen with `tmux capture-pane` after each. The stages are the fast fake stages
of tests/fixtures/job_project.py (nothing trains): a stage with `until_file` waits for a file the
test creates, so what the screen shows is waited for, never timed. Every wait polls the screen
until the text appears, with a bound against a hang."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from harness.pipeline import STAGES
from tests.fixtures.job_project import FAKE_STAGE, script_stem
from tests.fixtures.terminal import Terminal

pytestmark = pytest.mark.ssh

REPO = Path(__file__).resolve().parents[1]


def edit_starter_config(text: str, box: str, workdir: Path, knobs: dict[str, str]) -> str:
    """What a person changes in `harness init`'s starter: [hosts.gpu] points at their box, runs
    plain processes (no Docker here), and the stages get the fake stage's knobs."""
    changes = {f'ssh = "{box}"': f'ssh = "{box}"', 'workdir = "~/harness"': f'workdir = "{workdir}"',
               'runtime = "host"': 'runtime = "host"'}  # ssh and runtime: init's answers
    for old, new in changes.items():
        assert old in text, f"harness init's starter has no {old!r} any more: adapt this test"
        text = text.replace(old, new, 1)
    return text + "".join(f"\n[pipeline.stages.{stage}]\n{flags}\n" for stage, flags in knobs.items())


def test_the_first_session_in_a_terminal(tmp_path, ssh_host):
    project, work = tmp_path / "project", tmp_path / "box-workdir"
    (project / "remote_scripts").mkdir(parents=True)
    (project / "container").mkdir()  # init writes harness.toml beside the code sync sends
    for stage in STAGES.values():  # the project's pipeline: fast fake stages
        (project / "remote_scripts" / stage.script).write_text(FAKE_STAGE)
    train_may_end, export_may_end = tmp_path / "train-may-end", tmp_path / "export-may-end"
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "harness").exists(), f"no harness command beside {sys.executable}"
    env = ssh_host.env({**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)})
    term = Terminal(tmp_path, project, env)
    try:
        # init asks on a terminal: the box's name (Enter: gpu), how to reach it, the runtime, the
        # verifier and the data (Enter: the demo's, made on the box by its verifier stage)
        term.start("harness init")
        for prompt, answer in (("Name of the GPU box", ""), ("SSH target", ssh_host.alias), ("Runtime", "host"),
                               ("Verifier", ""), ("Chat data", "")):
            term.wait_for(prompt)
            term.type(answer)
        assert term.finish("harness init") == 0
        assert "wrote harness.toml" in term.output_of("harness init")
        config = project / "harness.toml"
        config.write_text(edit_starter_config(config.read_text(), ssh_host.alias, work, {
            "prepare": "lines = 3",
            "train": f'lines = 4\ntau_at = 2\nuntil_file = "{train_may_end}"',
            "export": f'lines = 2\nuntil_file = "{export_may_end}"',
        }))

        assert term.command("harness sync gpu") == 0, term.screen()
        assert (work / "remote_scripts" / STAGES["train"].script).read_text() == FAKE_STAGE

        # An attached run: a progress bar per stage, the stages' own lines but not the rest of their
        # logs (here: every line the fake stages print); train waits until we let it end.
        term.start("harness run gpu prepare extract train")
        screen = term.wait_until(lambda s: re.search(r"train tau=2\.5.*4/4 lines", s), "train's progress bar at 4/4 with its tau")
        assert f"{script_stem('prepare')}: line 3 of 3" not in screen, screen
        train_may_end.touch()
        assert term.finish("harness run gpu prepare extract train") == 0
        shown = term.output_of("harness run gpu prepare extract train")
        first_run = re.search(r"^(\S+)$", shown, re.M).group(1)  # stdout's run id line
        assert re.search(rf"run {first_run} on gpu: ok", shown), shown
        assert not re.search(r"\d+/\d+ lines", shown), shown  # the bars left with the run: no copies in the scrollback
        assert re.search(rf"\(\d+ library log lines not shown; the whole logs: harness logs gpu {first_run}\)", shown), shown

        assert term.command("harness status gpu") == 0
        table = term.output_of("harness status gpu")
        assert re.search(rf"run {first_run} on gpu: ok", table) and re.search(r"prepare\s.*ok", table) and re.search(r"train\s.*ok", table), table

        # A detached run, followed with logs -f; Ctrl-C stops the following, not the run.
        assert term.command("harness run gpu export --detach") == 0
        second_run = next(line for line in term.output_of("harness run gpu export --detach").splitlines() if (work / "runs" / line).is_dir())
        term.start("harness logs gpu last -f")
        term.wait_for(f"{script_stem('export')}: line 2 of 2")
        term.ctrl_c()
        assert term.finish("harness logs gpu last -f") == 130
        assert "detached from run last; it keeps running on gpu." in term.output_of("harness logs gpu last -f")
        assert term.command("harness status gpu last") == 0
        assert re.search(rf"run {second_run} on gpu: running", term.output_of("harness status gpu last"))

        export_may_end.touch()  # the run goes on by itself; re-attaching follows it to its end
        term.start("harness logs gpu last -f")
        assert term.finish("harness logs gpu last -f") == 0
        assert f"{script_stem('export')}: done, exit 0" in term.output_of("harness logs gpu last -f")

        assert term.command("harness pull gpu last") == 0, term.screen()
        pulled = project / "runs" / second_run
        assert (pulled / "run.json").is_file() and f"{script_stem('export')}: done, exit 0" in (pulled / "export" / "log").read_text()
    finally:
        term.close()
