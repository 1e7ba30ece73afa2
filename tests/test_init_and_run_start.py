"""The first session on one's own box, in pieces (tests/test_first_session.py types it whole):
`harness init` writes a complete starter, the config is found from a subdirectory (or $HARNESS_CONFIG, --config), and init -> run against the real test
sshd syncs the code and the laptop's data first, shows the stage command lines (--dry-run), and
refuses a verifier path missing on the box before anything starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_config
from harness.config_discovery import ConfigNotFound, discover

REPO = Path(__file__).resolve().parent.parent


def harness(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**(env or os.environ), "PYTHONPATH": str(REPO)}, input=stdin)


@pytest.fixture
def project(tmp_path) -> Path:
    """A checkout's layout: remote_scripts/ and container/ (copies), data/chat.jsonl."""
    root = tmp_path / "project"
    for d in ("remote_scripts", "container"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "data").mkdir()
    (root / "data" / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    return root


# -- config discovery ------------------------------------------------------------------------------


def test_the_config_is_found_from_a_subdirectory_like_git(tmp_path):
    (tmp_path / "harness.toml").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert discover(cwd=str(deep), environ={}) == str(tmp_path / "harness.toml")
    (tmp_path / "a" / "harness.toml").write_text("")  # the nearest wins
    assert discover(cwd=str(deep), environ={}) == str(tmp_path / "a" / "harness.toml")


def test_explicit_then_environment_then_walking_up(tmp_path):
    (tmp_path / "harness.toml").write_text("")
    other = tmp_path / "other.toml"
    other.write_text("")
    env = {"HARNESS_CONFIG": str(other)}
    assert discover(cwd=str(tmp_path), environ=env) == str(other)
    assert discover(str(tmp_path / "harness.toml"), cwd=str(tmp_path), environ=env) == str(tmp_path / "harness.toml")
    with pytest.raises(ConfigNotFound, match=r"nope.toml: config file not found \(from \$HARNESS_CONFIG\)"):
        discover(cwd=str(tmp_path), environ={"HARNESS_CONFIG": str(tmp_path / "nope.toml")})


def test_nothing_found_says_what_to_do(tmp_path):
    with pytest.raises(ConfigNotFound, match=r"no harness.toml in .* or above \(run `harness init`"):
        discover(cwd=str(tmp_path), environ={})


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_config_of_another_user_above_is_refused(tmp_path):
    (tmp_path / "harness.toml").write_text("")
    os.chown(tmp_path / "harness.toml", 65534, 65534)  # planted by someone else (a shared /tmp)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigNotFound, match="belongs to uid 65534, not you: not using it"):
        discover(cwd=str(tmp_path / "sub"), environ={})
    assert discover(str(tmp_path / "harness.toml"), environ={})  # named explicitly: the user's choice


def test_paths_resolve_from_the_config_not_the_cwd(project):
    r = harness("init", "--ssh", "box", "--data", "data/chat.jsonl", cwd=project)
    assert r.returncode == 0, r.stderr
    (project / "data" / "deeper").mkdir()
    # A home of its own: the starter's local host works in ~/harness-local, which another test's
    # sync may already hold (then nothing of remote_scripts/ would be "to send").
    home = project.parent / "home"
    home.mkdir()
    r = harness("run", "local", "prepare", "--dry-run", "--json", cwd=project / "data" / "deeper", env={**os.environ, "HOME": str(home)})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    # from a subdirectory: the project's files are what would be synced, data included
    assert {"remote_scripts/prepare_data.py", "data/chat.jsonl", "harness.toml"} <= set(plan["sync"]["send"])


# -- init ------------------------------------------------------------------------------------------


def test_init_from_flags_writes_a_complete_config(project):
    r = harness("init", "--host", "h100", "--ssh", "me@box:2222", "--runtime", "host", "--verifier", "org/model",
                "--data", "data/chat.jsonl", "--workdir", "/srv/h", cwd=project)
    assert r.returncode == 0, r.stderr
    config = load_config(project / "harness.toml")
    host = config.hosts["h100"]
    assert (host.ssh, host.runtime, host.workdir) == ("me@box:2222", "host", "/srv/h")
    assert (config.pipeline.verifier, config.pipeline.data) == ("org/model", "data/chat.jsonl")
    assert "data" in config.sync.paths  # the laptop's file reaches the box by sync, same relative path
    text = (project / "harness.toml").read_text()
    assert "[pipeline]" in text and "Hugging Face" in text and "[sync]" in text


def test_init_refuses_what_would_not_work_and_writes_nothing(project, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("{}\n")
    r = harness("init", "--data", str(outside), cwd=project)
    assert r.returncode == 2 and "is not synced: copy it under" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = harness("init", cwd=empty)
    assert r.returncode == 2 and r.stderr.startswith(f"harness: error: {empty} has no remote_scripts/ or container/")
    assert not (project / "harness.toml").exists() and list(empty.iterdir()) == []
    assert harness("init", cwd=project).returncode == 0
    (project / "harness.toml").write_text("# mine\n")
    r = harness("init", cwd=project)
    assert r.returncode == 2 and "already exists" in r.stderr and (project / "harness.toml").read_text() == "# mine\n"
    assert harness("init", "--force", "--ssh", "x@y", cwd=project).returncode == 0
    assert load_config(project / "harness.toml").hosts["gpu"].ssh == "x@y"
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_init_on_a_terminal_offers_the_ssh_aliases(project, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host *\n  User x\nHost gpu-a gpu-b\n  HostName a\nHost !neg\n")
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    os.chdir(project)
    try:
        # host name, ssh (alias number 2), runtime, verifier, data: Enter keeps a default
        code, out = answer_on_a_terminal([sys.executable, "-m", "harness", "init"], b"box\r2\rhost\r\rdata/chat.jsonl\r", env=env)
    finally:
        os.chdir(REPO)
    assert "[1] gpu-a, [2] gpu-b" in out, out
    assert code == 0, out
    config = load_config(project / "harness.toml")
    assert (config.hosts["box"].ssh, config.hosts["box"].runtime, config.pipeline.data) == ("gpu-b", "host", "data/chat.jsonl")


def answer_on_a_terminal(argv: list[str], keys: bytes, env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run argv on a fresh pseudo-terminal; type `keys` once its first prompt shows (the
    terminal keeps the lines for the prompts that follow); return (exit code, output)."""
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    out, typed, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            out += chunk
        if not typed and b"Name of the GPU box" in out:
            os.write(fd, keys)
            typed = True
    else:
        os.kill(pid, 9)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode(errors="replace")


def test_init_without_a_terminal_asks_nothing(project):
    r = harness("init", stdin="answers nobody reads\n", cwd=project)
    assert r.returncode == 0 and "SSH target" not in r.stdout + r.stderr
    assert load_config(project / "harness.toml").hosts["gpu"].ssh == "me@gpu-box.example.com"


# -- run without stages, the stage's own message ---------------------------------------------------


def test_run_without_stages_names_them(project):
    harness("init", cwd=project)
    r = harness("run", "local", cwd=project)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "`harness run local all`" in r.stderr and "prepare" in r.stderr


def test_a_stage_given_a_missing_verifier_path_says_so_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "remote_scripts" / "prepare_data.py"), "--verifier", str(tmp_path / "no-model"),
                        "--data", "x.jsonl", "--output", "out", "--events", "events.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    finished = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert finished["status"] == "failed"
    assert finished["error"].startswith(f"VerifierNotFound: {tmp_path / 'no-model'}: no such directory on this host")
    assert "Traceback" not in r.stderr and "Repo id" not in r.stderr


# -- init -> sync -> run against the real sshd -----------------------------------------------------


@pytest.mark.ssh
def test_init_then_run_syncs_code_and_data_first_and_checks_the_verifier_on_the_box(project, tmp_path, ssh_host):
    env = ssh_host.env()
    work = tmp_path / "box-work"
    r = harness("init", "--ssh", ssh_host.alias, "--runtime", "host", "--workdir", str(work),
                "--verifier", "models/missing/verifier", "--data", "data/chat.jsonl", cwd=project, env=env)
    assert r.returncode == 0, r.stderr
    sub = project / "data"  # from a subdirectory, as anyone would

    dry = harness("run", "gpu", "prepare", "--dry-run", "--json", cwd=sub, env=env)
    assert dry.returncode == 1, dry.stderr  # the dry run looked on the box: the verifier is not there
    plan = json.loads(dry.stdout)
    assert "data/chat.jsonl" in plan["sync"]["send"] and not plan["preflight"]["ok"]  # the data: sent by the sync, so not missing
    assert plan["preflight"]["error"] == (f"gpu: the verifier models/missing/verifier ([pipeline] verifier) does not exist on the host "
                                          f"(relative paths are under the workdir {work}): put it there, or name a Hugging Face model id")
    line = plan["commands"][0]["line"]
    assert line.startswith("python3 remote_scripts/prepare_data.py --verifier models/missing/verifier --data data/chat.jsonl")
    assert not work.exists()  # a dry run writes nothing on the box

    r = harness("run", "gpu", "prepare", cwd=sub, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "harness: error: gpu: the verifier models/missing/verifier ([pipeline] verifier) does not exist on the host "
        f"(relative paths are under the workdir {work}): put it there, or name a Hugging Face model id")
    # the sync came first: the stage scripts and the laptop's data are on the box; no run started
    assert (work / "data" / "chat.jsonl").read_bytes() == (project / "data" / "chat.jsonl").read_bytes()
    assert (work / "remote_scripts" / "prepare_data.py").is_file() and not (work / "runs").exists()

    # the verifier on the box: the same command starts (and the unchanged code is not sent again)
    (work / "models" / "missing" / "verifier").mkdir(parents=True)
    r = harness("run", "gpu", "prepare", "--detach", cwd=sub, env=env)
    assert r.returncode == 0, r.stderr
    assert "synced to" not in r.stderr
    run_id = r.stdout.strip()
    assert (work / "runs" / run_id / "prepare" / "spec.json").is_file()


def test_a_box_without_the_stage_scripts_is_refused_by_the_launch(tmp_path):
    """A config with no remote_scripts/ beside it syncs no stage: the launch says why, starts nothing."""
    (tmp_path / "harness.toml").write_text(f'[hosts.l]\nlocal = true\nworkdir = "{tmp_path / "w"}"\n')
    r = harness("run", "l", "prepare", cwd=tmp_path)
    assert r.returncode == 2
    assert "remote_scripts/prepare_data.py (stage prepare) is not on the host, and not beside" in r.stderr
    assert not (tmp_path / "w" / "runs").exists()


def test_check_extract_runs_the_synced_script_never_a_missing_one(project, tmp_path):
    work = tmp_path / "work"
    (project / "harness.toml").write_text(f'[hosts.l]\nlocal = true\nworkdir = "{work}"\n')
    r = harness("check-extract", "l", cwd=project)
    # nothing was extracted here: the synced script itself says so (not python's "can't open file")
    assert r.returncode != 0 and "can't open file" not in r.stderr, r.stderr
    assert (work / "remote_scripts" / "check_extraction.py").read_bytes() == (project / "remote_scripts" / "check_extraction.py").read_bytes()


def test_a_configured_data_path_missing_on_the_box_stops_the_run_before_any_stage(project, tmp_path):
    """The data is checked on the box with the scripts and the verifier, in the launch itself (and
    said by --dry-run): not found when prepare fails."""
    work = tmp_path / "w"
    (project / "harness.toml").write_text(f'[hosts.l]\nlocal = true\nworkdir = "{work}"\npython = "{sys.executable}"\n\n'
                                          '[pipeline]\nverifier = "org/model"\ndata = "data/missng.jsonl"\n')
    dry = harness("run", "l", "prepare", "--dry-run", cwd=project)
    assert dry.returncode == 1 and "preflight on l: FAILED: l: the chat data data/missng.jsonl ([pipeline] data) does not exist" in dry.stdout, dry.stdout
    r = harness("run", "l", "prepare", cwd=project)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "harness: error: l: the chat data data/missng.jsonl ([pipeline] data) does not exist on the host"), r.stderr
    assert not (work / "runs").exists()  # no run, no stage
