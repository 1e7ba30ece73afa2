"""The command line's surface: every mistake is one line `harness: error: WHAT (HINT)` with its
exit code (harness.errors, docs/troubleshooting.md), against the real test sshd, a TCP port that
speaks no SSH and a name that does not resolve; RUN defaults to the newest run; logs --tail and
--json, cancel --dry-run/--json; global options after the subcommand; shell completion from the
config and the local run-id cache (no connection); tables that fold at 80 columns."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.errors import EXIT_CONNECTION, EXIT_USAGE
from tests.fixtures.job_project import toml_value, write_project

pytestmark = pytest.mark.ssh


@pytest.fixture
def not_ssh():
    """A loopback port that accepts and answers garbage, as a web server on the wrong port would."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


@pytest.fixture
def project(tmp_path, ssh_host, not_ssh):
    config = write_project(tmp_path / "project", tmp_path / "work", {}, host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5})
    extra = [("garbage", f"root@127.0.0.1:{not_ssh}"), ("nowhere", "root@nowhere.invalid"), ("closed", f"root@127.0.0.1:{free_port()}")]
    with open(config, "a") as f:
        for name, target in extra:
            f.write(f"\n[hosts.{name}]\nssh = {toml_value(target)}\nconnect_timeout = 3\n")
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def harness(config: Path, ssh_host, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True,
                          env={**ssh_host.env(), **(env or {})}, timeout=120, cwd=cwd)


# (command line, exit code, in WHAT, in HINT)
MISTAKES = [
    (("sttus", "box"), EXIT_USAGE, "no command 'sttus'", "did you mean 'status'"),
    (("status", "bx"), EXIT_USAGE, "unknown host or group 'bx'", "did you mean 'box'"),
    (("exec", "bx", "true"), EXIT_USAGE, "unknown host 'bx'", "did you mean 'box'"),
    (("run", "box", "trian"), EXIT_USAGE, "unknown stage 'trian'", "did you mean 'train'"),
    (("run", "nowhere", "trian"), EXIT_USAGE, "unknown stage 'trian'", "did you mean 'train'"),  # checked before connecting
    (("status", "box", "--jsn"), EXIT_USAGE, "no such option: --jsn", "did you mean --json"),
    (("logs",), EXIT_USAGE, "Missing argument 'HOST'", "harness logs --help"),
    (("status", "box"), EXIT_USAGE, "box: no runs yet", "harness run box all"),
    (("cancel", "box"), EXIT_USAGE, "box: no runs yet", "harness run box all"),
    (("pull", "box", "20250101-000000-abcd"), EXIT_USAGE, "box: no runs yet", "harness run box all"),  # a part of an id, on a box with none
    (("status", "box", "last~x"), EXIT_USAGE, "invalid run id 'last~x'", "harness runs box"),
    (("logs", "box", "20250101-000000-abcdef"), EXIT_USAGE, "box: no run 20250101-000000-abcdef", "harness runs box"),
    (("pull", "box", "20250101-000000-abcdef"), EXIT_USAGE, "box: no run 20250101-000000-abcdef", "harness runs box"),
    (("status", "garbage"), EXIT_CONNECTION, "no SSH server answered", "speaks no SSH"),  # the same words from either client
    (("status", "garbage", "--json"), EXIT_CONNECTION, "no SSH server answered", "speaks no SSH"),
    (("sync", "garbage"), EXIT_CONNECTION, "no SSH server answered", "speaks no SSH"),
    (("status", "nowhere"), EXIT_CONNECTION, "cannot resolve host name 'nowhere.invalid'", "HostName"),
    (("pull", "nowhere", "last"), EXIT_CONNECTION, "Could not resolve hostname", "HostName"),
    (("runs", "closed"), EXIT_CONNECTION, "Connection refused", "is sshd running there"),
]


def test_each_mistake_is_one_line_with_its_next_step(project, ssh_host, tmp_path):
    for args, code, what, hint in MISTAKES:
        r = harness(project, ssh_host, *args, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert (r.returncode, len(lines), r.stdout) == (code, 1, ""), (args, r.returncode, r.stderr)
        assert lines[0].startswith("harness: error: ") and lines[0].endswith(")"), (args, lines)
        message, _, last = lines[0].rpartition(" (")  # the hint is the last parenthesis
        assert what in message and hint in last, (args, lines[0])

    doctor = harness(project, ssh_host, "doctor", "garbage", "--json")  # doctor answers with its table, exit as every command
    assert doctor.returncode == EXIT_CONNECTION and "Traceback" not in doctor.stderr
    assert json.loads(doctor.stdout)["checks"][0]["status"] == "fail"

    typo = tmp_path / "typo.toml"
    typo.write_text('[hosts.gpu]\nssh = "u@h"\nworkdri = "/x"\n')
    r = harness(typo, ssh_host, "hosts")
    assert (r.returncode, r.stderr.strip()) == (EXIT_USAGE, f"harness: error: {typo}: hosts.gpu.workdri: unknown key (did you mean 'workdir'?)")


def test_run_defaults_logs_tail_json_cancel_and_global_options_after(project, ssh_host, tmp_path):
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    started = harness(project, ssh_host, "run", "box", "prepare", "train", "--detach", "-q", env=cache)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert started.stderr.splitlines() == [f"run {run_id} started on box"]  # -q: no re-attach hint
    status = harness(project, ssh_host, "status", "box", "--json")  # RUN left out: the newest
    while json.loads(status.stdout)["state"] in ("running", "starting", "queued"):
        status = harness(project, ssh_host, "status", "box", "--json")
    assert json.loads(status.stdout)["run_id"] == run_id

    whole = harness(project, ssh_host, "logs", "box").stdout.splitlines()
    assert whole[-1].startswith("train_draft:") and len(whole) > 3
    assert harness(project, ssh_host, "logs", "box", "--tail", "3").stdout.splitlines() == whole[-3:]
    assert harness(project, ssh_host, "logs", "box", "last", "--tail", str(len(whole) + 5)).stdout.splitlines() == whole
    train = [json.loads(line) for line in harness(project, ssh_host, "logs", "box", "train", "--json").stdout.splitlines()]
    assert {item["stage"] for item in train} == {"train"} and train[-1]["state"]["state"] == "ok"
    assert [i["event"]["event"] for i in train if "event" in i][0] == "started"
    assert "".join(i["log"] for i in train if "log" in i).splitlines() == [ln for ln in whole if ln.startswith("train_draft")]

    pull = json.loads(harness(project, ssh_host, "pull", "box", "--dry-run", "--json", cwd=tmp_path).stdout)  # REMOTE left out: the newest run
    assert (pull["run_id"], pull["dry_run"]) == (run_id, True) and "train/log" in pull["planned"]

    dry = harness(project, ssh_host, "cancel", "box", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"host": "box", "run_id": run_id, "dry_run": True, "states": {"box": "ok"}, "ok": True, "ended_before": [],
                                      "would_stop": []}
    assert "nothing to cancel" in harness(project, ssh_host, "cancel", "box", "-n").stdout
    ended = harness(project, ssh_host, "cancel", "box")  # a run that had ended: said so, nothing stopped
    assert ended.returncode == 0 and ended.stdout.strip() == f"run {run_id} had already ended: ok (nothing to cancel)", ended.stdout

    # global options after the subcommand (the host-key error tells the user to add one there)
    after = subprocess.run([sys.executable, "-m", "harness", "status", "box", "--config", str(project), "--accept-new-host-key", "-q", "--json"],
                           capture_output=True, text=True, env=ssh_host.env(), timeout=60, cwd=tmp_path)
    assert after.returncode == 0 and json.loads(after.stdout)["run_id"] == run_id, after.stderr

    # completion: hosts from the config, stages, run ids from the cache `run` left; no connection
    def complete(words: str) -> list[str]:
        env = {**os.environ, **cache, "_HARNESS_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1),
               "HARNESS_SSH_CONFIG": "/nonexistent"}  # would fail any connection
        r = subprocess.run([sys.executable, "-m", "harness"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        return [line.split(",", 1)[1] for line in r.stdout.splitlines()]

    assert "box" in complete("harness --config " + str(project) + " status b") and "garbage" not in complete("harness --config " + str(project) + " status b")
    assert complete("harness --config " + str(project) + " run box tra") == ["train"]
    assert complete("harness --config " + str(project) + " logs box 2") == [run_id]
    script = harness(project, ssh_host, "completion", "bash")
    assert script.returncode == 0 and "_HARNESS_COMPLETE=bash_complete" in script.stdout


def test_help_lists_the_real_checks_and_stages_and_tables_fold_at_80_columns(monkeypatch, capsys):
    from click.testing import CliRunner

    from harness.cli import cli
    from harness.cli.render import print_checks
    from harness.doctor import CheckResult, check_catalogue
    from harness.pipeline import STAGES

    doctor_help = CliRunner().invoke(cli, ["doctor", "--help"], terminal_width=200).output
    checks = check_catalogue()
    assert len(checks) == len({n for n, _ in checks}) and all(f"{name}: {about}" in doctor_help for name, about in checks)
    run_help = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200).output
    assert all(f"{s.name}: {s.summary}" in run_help for s in STAGES.values())

    monkeypatch.setenv("COLUMNS", "80")
    fix = "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker && systemctl restart docker`"
    print_checks("gpu", [CheckResult("stage-gpus", "fail", "a container cannot get a GPU: /very/long/path/" + "x" * 60, fix)])
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    cells = "".join(line.split("│")[4].strip() for line in out.splitlines() if line.count("│") == 5)
    assert cells.replace(" ", "") == fix.replace(" ", "")


def test_tail_reads_back_over_the_stages_in_order(tmp_path):
    from harness.host_helpers import follow, run_files

    logs = {"a": b"a1\na2\na3\n", "b": b"b1\nb2", "c": b""}
    for stage, text in logs.items():
        d = Path(run_files.stage_dir(str(tmp_path), stage))
        d.mkdir(parents=True)
        (d / "log").write_bytes(text)
    every = b"".join(logs.values()).decode().splitlines()
    for n in range(1, len(every) + 3):
        first, offset = follow.tail_start(str(tmp_path), list(logs), n)
        shown = b"".join(text[offset if i == 0 else 0:] for i, text in enumerate(list(logs.values())[first:]))
        assert shown.decode().splitlines() == every[-n:], n


@pytest.mark.parametrize("argv", [["--version"], ["run"]])
def test_the_exit_code_holds_after_a_ctrl_c_caught_inside_generated_code(argv, tmp_path):
    """Ctrl-C can land inside code Python generates from text (a dataclass's methods, made by a
    lazy import while `harness run` streams); harness catches it and exits 130, but CPython would
    still end a `python -m` process by SIGINT (-2) unless harness clears that record as it exits."""
    (tmp_path / "interrupted_harness.py").write_text(
        "import sys\nimport harness.cli.app as app\n"
        "command = app.cli.main\n"
        "def interrupted(*args, **kwargs):  # the command, then a Ctrl-C that generated code raised and harness caught\n"
        "    try:\n        return command(*args, **kwargs)\n"
        "    finally:\n        try:\n            exec('raise KeyboardInterrupt')\n        except KeyboardInterrupt:\n            pass\n"
        "app.cli.main = interrupted\n"
        f"sys.argv = ['harness', *{argv!r}]\n"
        "app.run()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "interrupted_harness"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == (0 if argv == ["--version"] else EXIT_USAGE), r.stderr
