"""The warm exec (harness/transport/warm_exec.py, cli/warm.py) against the real sshd: a second
`harness exec` of a host runs from the recipe the first left, gives what the slow path gives
(output, exit code, stdin, env values kept off the command line and out of the recipe), and is
taken only while nothing it was made from changed. Whether a call was warm shows in its import
log (`python -X importtime`): the Click group, harness.cli.app, is imported on the slow path only.
The host-key cases (a removed key, a repointed alias, with a recipe in place) are in
tests/test_host_key_table.py's `harness-exec` path."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli.warm import parse
from harness.transport.warm_exec import RACY_NS
from tests.fixtures.sshd import SSHHost, stop_control_masters

pytestmark = pytest.mark.ssh

TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "x\ny", "héllo ✓", "*", "", "--", "-n"]
SECRET_NAME, SECRET = "HARNESS_WARM_TEST_TOKEN", "s3cr3t-value-for-the-warm-exec"


@dataclass
class Call:
    code: int
    out: bytes
    err: bytes  # without the import log
    warm: bool


@dataclass
class Client:
    """A laptop of its own: ssh_config, known_hosts, control sockets, harness.toml."""

    bed: SSHHost
    root: Path
    ssh_config: Path
    known_hosts: Path
    control_dir: Path
    config: Path

    def write_config(self, workdir: str = "work") -> None:
        self.config.write_text(f'[hosts.box]\nssh = "box"\nworkdir = "{self.root / workdir}"\nconnect_timeout = 5\nenv = ["{SECRET_NAME}"]\n')

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", SECRET_NAME)}
        return {**env, "HARNESS_SSH_CONFIG": str(self.ssh_config), "HARNESS_KNOWN_HOSTS": str(self.known_hosts),
                "HARNESS_CONTROL_DIR": str(self.control_dir), **extra}

    def exec(self, *argv: str, input: bytes | None = None, config: str | None = None, cwd: Path | None = None, **env: str) -> Call:
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "--config", config or str(self.config), "exec", "box", "--", *argv],
                           env=self.env(**env), input=input, stdin=None if input is not None else subprocess.DEVNULL,
                           capture_output=True, timeout=60, cwd=cwd)
        lines = r.stderr.split(b"\n")
        imports = [line for line in lines if line.startswith(b"import time:")]
        assert imports, "no import log: -X importtime was not honoured"
        err = b"\n".join(line for line in lines if not line.startswith(b"import time:"))
        return Call(r.returncode, r.stdout, err, warm=not any(line.rstrip().endswith(b"harness.cli.app") for line in imports))

    def age(self) -> None:
        """Wait until every file written so far is older than the racy window (a recipe is written
        only from inputs that cannot have changed unseen since they were read)."""
        time.sleep(RACY_NS / 1e9 + 0.2)

    def recipes(self) -> list[Path]:
        return sorted(self.control_dir.glob("exec-*"))


@pytest.fixture
def client(ssh_host, tmp_path):
    control = Path(tempfile.mkdtemp(prefix="hwe-"))  # short: unix socket paths are limited
    (tmp_path / "ssh").mkdir()  # like ~/.ssh: a directory of its own (a route watches it; the workdir is made elsewhere)
    c = Client(ssh_host, tmp_path, tmp_path / "ssh" / "config", tmp_path / "ssh" / "known_hosts", control, tmp_path / "harness.toml")
    c.ssh_config.write_text(ssh_host.ssh_config.read_text())
    c.known_hosts.write_text(ssh_host.known_hosts_lines())
    c.write_config()
    yield c
    stop_control_masters(control)


def test_the_second_exec_is_warm_and_gives_what_the_slow_path_gives(client):
    client.age()
    slow = client.exec("printf", "%s\\0", *TRICKY)
    assert (slow.code, slow.warm) == (0, False), slow.err
    assert len(client.recipes()) == 1
    warm = client.exec("printf", "%s\\0", *TRICKY)
    assert warm.warm and (warm.code, warm.out, warm.err) == (slow.code, slow.out, slow.err)
    assert warm.out.decode().split("\0")[:-1] == TRICKY
    assert client.exec("sh", "-c", "pwd; echo err >&2; exit 7") == Call(7, f"{client.root / 'work'}\n".encode(), b"err\n", True)
    assert client.exec("wc", "-c", input=b"x" * 100_000) == Call(0, b"100000\n", b"", True)  # stdin reaches the command


def test_a_config_named_through_a_symlink_or_dotdot_finds_the_recipe(client):
    link = client.root / "link"  # the project's directory through a symlink (macOS's /tmp is one)
    link.symlink_to(client.root)
    client.age()
    assert not client.exec("true", config=str(link / "harness.toml")).warm
    assert client.exec("true", config=str(link / "harness.toml")).warm
    assert client.exec("true", config="../harness.toml", cwd=client.root / "ssh").warm  # the same file: the same recipe
    assert client.exec("true").warm


def test_env_values_reach_the_command_and_stay_out_of_the_recipe(client):
    client.age()
    # every process's command line on the machine (/proc, not ps: procps is not on every fresh machine)
    show = ("sh", "-c", f'echo "${SECRET_NAME}"; for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f" 2>/dev/null; echo; done')
    slow = client.exec(*show, **{SECRET_NAME: SECRET})
    warm = client.exec(*show, **{SECRET_NAME: SECRET})
    assert (slow.warm, warm.warm) == (False, True)
    for call in (slow, warm):
        first, *processes = call.out.decode().splitlines()
        assert first == SECRET
        assert any(p.startswith("ssh ") for p in processes)  # the list holds the client's own command line
        assert not [p for p in processes if SECRET in p]  # never on a command line
    assert all(SECRET.encode() not in p.read_bytes() for p in client.recipes())
    bad = client.exec(*show, **{SECRET_NAME: "two\nlines"})  # a value no env line can carry: the slow path's one line
    # (the recipe holds: the warm path declines it)
    assert (bad.code, bad.err.decode().strip()) == (2, f"harness: error: environment variable {SECRET_NAME} contains a newline or NUL; "
                                                        "such values cannot be passed to a remote host")
    unset = client.exec(*show)  # the name is no longer set: the recipe was made with it
    assert not unset.warm and unset.out.decode().splitlines()[0] == ""


def _edit_known_hosts(c: Client) -> None:
    c.known_hosts.write_text(c.known_hosts.read_text() + "# a comment\n")


def _edit_ssh_config(c: Client) -> None:
    c.ssh_config.write_text(c.ssh_config.read_text() + "# a comment\n")


def _edit_harness_config(c: Client) -> None:
    c.write_config(workdir="elsewhere")


def _master_gone(c: Client) -> None:
    for sock in c.control_dir.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)
    assert c.recipes()  # the recipe stays: only its master is gone


def _include_gains_a_file(c: Client) -> None:
    (c.root / "ssh_config.d" / "extra.conf").write_text("Host nothing-here\n  Port 1\n")


CHANGES = {
    "known_hosts edited": _edit_known_hosts,
    "ssh_config edited": _edit_ssh_config,
    "harness.toml edited": _edit_harness_config,
    "master gone": _master_gone,
    "a file appears where an Include looks": _include_gains_a_file,
}


@pytest.mark.parametrize("change", CHANGES)
def test_any_change_of_an_input_sends_the_exec_back_to_the_slow_path(client, change):
    (client.root / "ssh_config.d").mkdir()
    client.ssh_config.write_text(client.ssh_config.read_text() + f"Include {client.root}/ssh_config.d/*.conf\n")
    client.age()
    assert not client.exec("true").warm
    assert client.exec("true").warm
    CHANGES[change](client)
    after = client.exec("pwd")
    assert (after.code, after.warm) == (0, False), after.err
    workdir = "elsewhere" if change == "harness.toml edited" else "work"
    assert after.out.decode().strip() == str(client.root / workdir)


def test_a_configuration_read_differently_with_nothing_changed_on_disk_is_never_warm(client):
    client.ssh_config.write_text(client.ssh_config.read_text() + 'Match exec "true"\n  ServerAliveCountMax 3\n')
    client.age()
    assert client.exec("true").code == 0
    assert client.recipes() == []
    assert not client.exec("true").warm


def test_a_recipe_is_not_made_from_inputs_changed_within_the_racy_window(client):
    # just written (the fixture): an edit right after they were read could carry the same stamp
    assert client.exec("true").code == 0
    assert client.recipes() == []
    client.age()
    client.exec("true")
    assert client.exec("true").warm


@pytest.mark.parametrize("argv, expected", [
    (["exec", "box", "--", "ls", "-la"], ("harness.toml", "box", ["ls", "-la"])),
    (["--config", "c.toml", "exec", "box", "true"], ("c.toml", "box", ["true"])),
    (["--config=c.toml", "exec", "box", "--", "--", "x"], ("c.toml", "box", ["--", "x"])),
    (["exec", "box", "ls", "-la"], None),  # options among the words: click's reading rules
    (["exec", "--pty", "box", "--", "top"], None),
    (["--accept-new-host-key", "exec", "box", "--", "true"], None),
    (["exec", "box", "--"], None),
    (["exec", "box"], None),
    (["run", "box", "train"], None),
    (["--config", "", "exec", "box", "--", "true"], None),
    ([], None),
])
def test_only_the_plain_form_is_offered_to_the_warm_exec(argv, expected, tmp_path, monkeypatch):
    (tmp_path / "harness.toml").write_text("")
    (tmp_path / "c.toml").write_text("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # the config is found as the Click side finds it: walking up
    monkeypatch.delenv("HARNESS_CONFIG", raising=False)
    expected = expected and (str(tmp_path / expected[0]) if expected[0] == "harness.toml" else f"../{expected[0]}", *expected[1:])
    argv = [f"../{a}" if a == "c.toml" else a.replace("=c.toml", "=../c.toml") for a in argv]
    got = parse(argv)
    if expected is None:
        assert got is None
    else:
        assert got == (os.path.realpath(expected[0]), expected[1], expected[2])


def test_an_upgrade_of_harness_sends_the_exec_back_to_the_slow_path(client):
    """A recipe holds a command line one version of harness made: another version never replays
    it, even one that kept the version string (its files changed)."""
    import shutil

    installed = client.root / "site"
    shutil.copytree(Path(__file__).resolve().parents[1] / "harness", installed / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    client.age()  # (cwd: not this checkout, whose harness `python -m` would import first)
    assert not client.exec("true", cwd=client.root, PYTHONPATH=str(installed)).warm
    assert client.exec("true", cwd=client.root, PYTHONPATH=str(installed)).warm
    init = installed / "harness" / "__init__.py"
    upgraded = init.with_name("__init__.py.new")  # as an installer does: the new file, renamed over the old
    upgraded.write_text(init.read_text().replace('__version__ = "', '__version__ = "9.'))
    upgraded.replace(init)
    after = client.exec("true", cwd=client.root, PYTHONPATH=str(installed))
    assert (after.code, after.warm) == (0, False), after.err
    runtime = installed / "harness" / "runtime" / "host.py"
    client.age()
    client.exec("true", cwd=client.root, PYTHONPATH=str(installed))  # (the last left none: its inputs had just changed)
    assert client.exec("true", cwd=client.root, PYTHONPATH=str(installed)).warm
    runtime.write_text(runtime.read_text() + "\n")  # the same version string, other code
    assert not client.exec("true", cwd=client.root, PYTHONPATH=str(installed)).warm
