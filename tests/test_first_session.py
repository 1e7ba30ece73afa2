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
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.pipeline import STAGES
from tests.fixtures.beds import bed_unavailable
from tests.fixtures.job_project import FAKE_STAGE, script_stem

pytestmark = pytest.mark.ssh

REPO = Path(__file__).resolve().parents[1]
PROMPT = re.compile(r"^\[(\d+)\]\$ ?(.*)$")  # PS1 '[$?]$ ': every prompt shows the last exit code
HANG_S = 60  # a guard against a hang (a loaded CI machine), not a speed claim


class Terminal:
    """One tmux pane running bash (160 x 50), on a socket of the test's own."""

    def __init__(self, root: Path, cwd: Path, env: dict[str, str]):
        if shutil.which("tmux") is None:
            bed_unavailable("tmux", "tmux is not installed (scripts/test.sh installs it)")
        self.socket = str(root / "tmux.sock")
        self.conf = root / "tmux.conf"  # read when the server starts: the first pane keeps all it shows
        self.conf.write_text("set-option -g history-limit 100000\n")
        env = {**env, "HISTFILE": str(root / "bash_history"), "TERM": "xterm-256color"}
        self._tmux("new-session", "-d", "-x", "160", "-y", "50", "-c", str(cwd), "bash --norc --noprofile", env=env)
        try:
            self.type("PS1='[$?]$ '")
            self.wait_until(lambda screen: self.prompts(screen) == 1, "the first prompt")
        except BaseException:
            self.close()
            raise

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(["tmux", "-S", self.socket, "-f", str(self.conf), *args], env=env, capture_output=True, text=True,
                              check=True, timeout=10).stdout

    def screen(self) -> str:
        """Everything the pane showed since it opened (scrollback included), wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-")

    @staticmethod
    def prompts(screen: str) -> int:
        return sum(1 for line in screen.splitlines() if PROMPT.match(line))

    def wait_until(self, done, what: str, timeout: float = HANG_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if done(screen):
                return screen
            assert time.monotonic() < deadline, f"the screen never showed {what}:\n{screen}"
            time.sleep(0.1)

    def wait_for(self, text: str) -> str:
        return self.wait_until(lambda screen: text in screen, repr(text))

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-l", line)
        self._tmux("send-keys", "Enter")

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "C-c")

    def command(self, line: str) -> int:
        """Type LINE and wait for the next prompt; the exit code it shows."""
        self.start(line)
        return self.finish(line)

    def start(self, line: str) -> None:
        self._before = self.prompts(self.screen())
        self.type(line)

    def finish(self, line: str) -> int:
        screen = self.wait_until(lambda s: self.prompts(s) > self._before, f"the prompt after `{line}`")
        return int(PROMPT.match([x for x in screen.splitlines() if PROMPT.match(x)][-1]).group(1))

    def output_of(self, line: str) -> str:
        """What the screen shows between the prompt where LINE was typed and the next prompt."""
        lines = self.screen().splitlines()
        start = max(i for i, x in enumerate(lines) if (m := PROMPT.match(x)) and m.group(2) == line)
        end = next(i for i in range(start + 1, len(lines)) if PROMPT.match(lines[i]))
        return "\n".join(lines[start + 1:end])

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)  # bash and its children get SIGHUP


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

        # An attached run: log lines and a progress bar per stage; train waits until we let it end.
        term.start("harness run gpu prepare train")
        screen = term.wait_until(lambda s: re.search(r"train tau=2\.5.*4/4 lines", s), "train's progress bar at 4/4 with its tau")
        assert f"{script_stem('prepare')}: line 3 of 3" in screen and f"{script_stem('train')}: line 4 of 4" in screen, screen
        train_may_end.touch()
        assert term.finish("harness run gpu prepare train") == 0
        shown = term.output_of("harness run gpu prepare train")
        first_run = re.search(r"^(\S+)$", shown, re.M).group(1)  # stdout's run id line
        assert re.search(rf"run {first_run} on gpu: ok", shown), shown
        assert not re.search(r"\d+/\d+ lines", shown), shown  # the bars left with the run: no copies in the scrollback

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
