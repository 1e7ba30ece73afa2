"""Detached runs on runtime = "host": the supervisor, state files, logs, exit codes, cancel,
concurrency, secrets, and survival of the harness process (LocalTransport here; the SSH
variants are at the end and use the real sshd test bed)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.host import Host
from harness.jobs import Jobs
from harness.transport import connect
from tests.fixtures.job_project import expected_log, log_lines, run_in_pty, script_stem, write_project
from tests.fixtures.processes import processes_showing

SECRET_NAME = "HARNESS_TEST_SECRET"
SECRET_VALUE = "s3cr3t-value-" + os.urandom(6).hex()


def make_jobs(tmp_path: Path, stages: dict, **kw) -> tuple[Jobs, Path]:
    workdir = tmp_path / "work"
    config_path = write_project(tmp_path / "project", workdir, stages, **kw)
    config = load_config(config_path)
    host = config.host("box")
    transport = connect(host)
    return Host(config, host, lambda _name: transport).jobs, workdir


def harness_cli(config: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=120, **kw)


def collect(jobs: Jobs, run_id: str, stage: str | None = None, follow: bool = False) -> str:
    chunks: list[bytes] = []
    jobs.stream_logs(run_id, chunks.append, stage=stage, follow=follow)
    return b"".join(chunks).decode()


def test_an_ended_stage_shows_how_it_ended_not_a_later_ranks_progress(tmp_path):
    jobs, _ = make_jobs(tmp_path, {"prepare": {"lines": 1, "late_progress": True}})
    status = jobs.wait(jobs.launch(["prepare"]).run_id, timeout=60)
    assert status.state == "ok", status
    assert status.stages[0].last_event["event"] == "finished"  # the events file ends with a progress line


def test_chain_runs_detached_with_complete_logs_and_record(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 4}, "train": {"lines": 3, "sleep": 0.5}})
    run_id = jobs.launch(["prepare", "train"]).run_id
    status = jobs.wait(run_id, timeout=60)
    assert status.state == "ok", status
    assert [(s.stage, s.state, s.exit_code) for s in status.stages] == [("prepare", "ok", 0), ("train", "ok", 0)]
    assert status.stages[1].last_event["event"] == "finished"
    assert all(s.started and s.finished >= s.started for s in status.stages)
    # stage order: train started after prepare finished
    assert status.stages[1].started >= status.stages[0].finished
    for stage, lines in (("prepare", 4), ("train", 3)):
        text = collect(jobs, run_id, stage)
        assert log_lines(text) == expected_log(script_stem(stage), lines)
        assert f"cwd {workdir}" in text  # stages run in the workdir
    run_dir = workdir / "runs" / run_id
    record = json.loads((run_dir / "run.json").read_text())
    assert record["run_id"] == run_id and record["stages"] == ["prepare", "train"] and record["runtime"] == "host"
    assert record["git"]["commit"] is None or len(record["git"]["commit"]) == 40
    assert set(record["versions"]) == {"torch", "transformers", "speculators", "vllm"}
    import importlib.metadata as md

    assert record["versions"]["transformers"] == md.version("transformers")  # the host's python here
    assert record["versions"]["vllm"] is None
    events = [json.loads(line) for line in (run_dir / "train" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["started", "progress", "progress", "progress", "finished"]
    spec = json.loads((run_dir / "prepare" / "spec.json").read_text())
    assert spec["command"][1] == "remote_scripts/prepare_data.py" and "--events" in spec["command"]



def test_cli_run_all_runs_the_default_chain_in_order(tmp_path):
    """`harness run HOST all`: regenerate -> prepare -> extract -> train -> evaluate -> export -> serve_check (the
    job tests' fake stages; the real stages run as this chain behind `verifier` in `harness run
    HOST demo`: tests/test_kimi_k25.py, tests/test_container_ml.py)."""
    from harness.pipeline import DEFAULT_CHAIN

    config = write_project(tmp_path / "project", tmp_path / "work", {stage: {"lines": 1} for stage in DEFAULT_CHAIN})
    r = harness_cli(config, "run", "box", "all")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[0]
    status = json.loads(harness_cli(config, "status", "box", run_id, "--json").stdout)
    assert [(s["stage"], s["state"]) for s in status["stages"]] == [(stage, "ok") for stage in DEFAULT_CHAIN]
    assert DEFAULT_CHAIN == ["regenerate", "prepare", "extract", "train", "evaluate", "export", "serve_check"]  # docs/usage.md's chain
    finished = [s["finished"] for s in status["stages"]]
    assert all(b["started"] >= a for b, a in zip(status["stages"][1:], finished))  # one after another

def test_failed_stage_stops_chain_and_keeps_exit_code(tmp_path):
    jobs, _ = make_jobs(tmp_path, {"prepare": {"lines": 2, "exit_code": 7}})
    run_id = jobs.launch(["prepare", "train", "evaluate"]).run_id
    status = jobs.wait(run_id, timeout=60)
    assert status.state == "failed"
    assert [(s.stage, s.state, s.exit_code) for s in status.stages] == [("prepare", "failed", 7), ("train", "skipped", None), ("evaluate", "skipped", None)]
    assert log_lines(collect(jobs, run_id)) == expected_log("prepare_data", 2, exit_code=7)


def test_cancel_terminates_then_records_cancelled(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 100, "sleep": 100}})
    run_id = jobs.launch(["prepare", "train"], grace_s=2).run_id
    _wait_for_line(jobs, run_id, "line 2 of 100")
    pgid = json.loads((workdir / "runs" / run_id / "prepare" / "state.json").read_text())["pgid"]
    t0 = time.monotonic()
    assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"
    assert time.monotonic() - t0 < 60  # SIGTERM ended it: no wait for a grace period (generous: loaded CI)
    status = jobs.status(run_id)
    assert [(s.stage, s.state) for s in status.stages] == [("prepare", "cancelled"), ("train", "cancelled")]
    assert status.stages[0].exit_code == -signal.SIGTERM  # it died of the SIGTERM
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_a_stage_that_fails_once_its_group_is_being_cancelled_is_cancelled(tmp_path):
    """A group's cancel marks every node first (harness.multinode.GroupRun.cancel_run): a node whose
    ranks die of an earlier node's cancel, before its own cancel lands, is cancelled, and so is
    the rest of its chain. Without the mark the same failure is a failure."""
    release = tmp_path / "release"
    outcomes = {}
    for marked in (False, True):
        release.unlink(missing_ok=True)
        jobs, _ = make_jobs(tmp_path / str(marked), {"prepare": {"lines": 1, "until_file": str(release), "exit_code": 3}})
        run_id = jobs.launch(["prepare", "train"]).run_id
        _wait_for_line(jobs, run_id, "line 1 of 1")
        if marked:
            jobs.mark_cancelling(run_id)
            assert jobs.status(run_id).state == "running"  # the mark stops nothing
        release.touch()
        status = jobs.wait(run_id, timeout=60)
        outcomes[marked] = (status.state, [(s.stage, s.state, s.exit_code) for s in status.stages])
    assert outcomes[False] == ("failed", [("prepare", "failed", 3), ("train", "skipped", None)])
    assert outcomes[True] == ("cancelled", [("prepare", "cancelled", 3), ("train", "cancelled", None)])


def test_cancel_escalates_to_sigkill_after_grace(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 100, "sleep": 100, "ignore_term": True}})
    run_id = jobs.launch(["prepare"], grace_s=1.5).run_id
    _wait_for_line(jobs, run_id, "line 1 of 100")
    t0 = time.monotonic()
    assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"
    elapsed = time.monotonic() - t0
    assert 1.4 < elapsed < 60, elapsed  # waited the grace period, then killed
    assert jobs.status(run_id).stages[0].exit_code == -signal.SIGKILL


def test_two_concurrent_runs_never_collide(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 5, "sleep": 1}})
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(jobs.launch(["prepare"], fresh=["all"]).run_id)) for _ in range(2)]  # both run: no reuse
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 2
    for run_id in ids:
        assert jobs.wait(run_id, timeout=60).state == "ok"
        assert log_lines(collect(jobs, run_id)) == expected_log("prepare_data", 5)
    assert sorted(r.run_id for r in jobs.listing().runs[jobs.name]) == sorted(ids)


def test_secret_values_reach_the_stage_but_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 1, "print_env": SECRET_NAME}}, host_table={"env": [SECRET_NAME]})
    run_id = jobs.launch(["prepare"]).run_id
    assert jobs.wait(run_id, timeout=60).state == "ok"
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    assert f"env {SECRET_NAME} sha256 {digest}" in collect(jobs, run_id)  # delivered
    assert_secret_absent(workdir, SECRET_VALUE)
    record = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    assert record["env_names"] == [SECRET_NAME]


def test_bad_run_ids_and_stages_are_one_line_errors(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {})
    config = tmp_path / "project" / "harness.toml"
    r = harness_cli(config, "logs", "box", "../../etc")
    assert r.returncode == 2 and "invalid run id" in r.stderr and "Traceback" not in r.stderr
    r = harness_cli(config, "run", "box", "nosuchstage", "--detach")
    assert r.returncode == 2 and "unknown stage 'nosuchstage'" in r.stderr
    r = harness_cli(config, "status", "box", "20200101-000000-abcdef")
    assert r.returncode == 2 and "no run" in r.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


def test_cli_run_survives_killing_harness_and_logs_f_is_complete(tmp_path):
    """Attached `harness run`, killed with SIGKILL (with its whole process group, like a closed
    laptop): the chain goes on, and `harness logs -f` afterwards shows every line."""
    make_jobs(tmp_path, {"prepare": {"lines": 3, "sleep": 1.5}, "train": {"lines": 6, "sleep": 3}})
    config = tmp_path / "project" / "harness.toml"
    proc, run_id = start_attached_run(config)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", run_id, "-f"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert log_lines(r.stdout) == expected_log("prepare_data", 3) + expected_log("train_draft", 6)
    r = harness_cli(config, "status", "box", run_id)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout


def test_cli_status_runs_cancel(tmp_path):
    make_jobs(tmp_path, {"prepare": {"lines": 50, "sleep": 50}})
    config = tmp_path / "project" / "harness.toml"
    r = harness_cli(config, "run", "box", "prepare", "train", "--detach", "--grace", "1")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    assert "harness logs box " + run_id in r.stderr
    r = _wait_for_status(lambda: harness_cli(config, "status", "box", run_id).stdout, "running")
    assert "prepare" in r and "pending" in r
    r = harness_cli(config, "cancel", "box", "last")
    assert r.returncode == 0 and f"run {run_id}: cancelled" in r.stdout
    r = harness_cli(config, "runs", "box")
    assert run_id in r.stdout and "cancelled" in r.stdout
    r = harness_cli(config, "status", "box", run_id)
    assert r.returncode == 1 and "cancelled" in r.stdout


def test_status_shows_the_latest_tau_while_a_stage_runs(tmp_path):
    # three lines, then the stage waits for a file nobody writes: what status shows stays put
    jobs, _ = make_jobs(tmp_path, {"train": {"lines": 3, "tau_at": 2, "until_file": str(tmp_path / "never")}})
    config = tmp_path / "project" / "harness.toml"
    run_id = jobs.launch(["train"]).run_id
    deadline = time.monotonic() + 60
    while True:  # until progress events have followed the tau metric: the last event is not the tau
        train = jobs.status(run_id).stages[0]
        if train.last_event and train.last_event.get("event") == "progress" and train.last_event.get("step", 0) >= 3:
            break
        assert time.monotonic() < deadline, train
        time.sleep(0.2)
    assert train.state == "running" and train.tau == {"step": 2, "tau": 2.5}
    r = harness_cli(config, "status", "box", run_id, env={**os.environ, "COLUMNS": "200"})  # one line per row
    assert r.returncode == 0 and "3/3 lines  (tau 2.50 at step 2)" in r.stdout, r.stdout
    jobs.cancel_run(run_id, 1)


def test_dead_supervisor_shows_lost_and_cancel_cleans_up(tmp_path):
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 100, "sleep": 100}})
    run_id = jobs.launch(["prepare", "train"], grace_s=1).run_id
    _wait_for_line(jobs, run_id, "line 1 of 100")
    run_dir = workdir / "runs" / run_id
    os.kill(json.loads((run_dir / "state.json").read_text())["pid"], signal.SIGKILL)
    status = _wait_for_status(lambda: jobs.status(run_id), "lost", key=lambda s: s.state)
    assert status.stages[0].state == "lost"  # no stage of an ended run reads running: nobody supervises it (it may still run)
    assert "line 1 of 100" in collect(jobs, run_id, follow=True)  # follow ends: nobody will finish it
    pgid = json.loads((run_dir / "prepare" / "state.json").read_text())["pgid"]
    os.killpg(pgid, 0)  # the stage itself still runs
    assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"
    assert _dead(pgid)  # (its parent is gone: a zombie until init reaps it counts as dead)
    assert [(s.stage, s.state) for s in jobs.status(run_id).stages] == [("prepare", "cancelled"), ("train", "cancelled")]


def test_cancel_of_a_lost_run_signals_no_stranger_that_now_holds_its_pgid(tmp_path):
    """A run lost across a reboot: its recorded pgid now leads an unrelated process group (a
    `sleep` started here stands for it; a reboot cannot be made, so the record is pointed at it).
    cancel says the run is lost and signals nothing."""
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 100, "sleep": 100}})
    run_id = jobs.launch(["prepare"], grace_s=1).run_id
    _wait_for_line(jobs, run_id, "line 1 of 100")
    run_dir = workdir / "runs" / run_id
    stage_state = json.loads((run_dir / "prepare" / "state.json").read_text())
    assert stage_state["leader"]["start_time"] > 0 and stage_state["leader"]["boot_id"]
    os.kill(json.loads((run_dir / "state.json").read_text())["pid"], signal.SIGKILL)  # the supervisor, then its stage: "the reboot"
    os.killpg(stage_state["pgid"], signal.SIGKILL)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (run_dir / "prepare" / "state.json").write_text(json.dumps({**stage_state, "pid": stranger.pid, "pgid": stranger.pid}))
        _wait_for_status(lambda: jobs.status(run_id), "lost", key=lambda s: s.state)
        assert jobs.cancel_run(run_id).states[jobs.name] == "lost"
        assert stranger.poll() is None  # not signalled
        assert jobs.status(run_id).state == "lost"
    finally:
        stranger.kill()
        stranger.wait()


def test_cancel_after_a_reboot_signals_no_process_whose_start_time_matches_by_chance(tmp_path):
    """The leader's identity is its start time AND the boot it started in: after a reboot a
    stranger may hold the recorded pgid with the same start time (clock ticks after boot); the
    boot id tells them apart (a reboot cannot be made: the record names another boot)."""
    jobs, workdir = make_jobs(tmp_path, {"prepare": {"lines": 100, "sleep": 100}})
    run_id = jobs.launch(["prepare"], grace_s=1).run_id
    _wait_for_line(jobs, run_id, "line 1 of 100")
    run_dir = workdir / "runs" / run_id
    stage_state = json.loads((run_dir / "prepare" / "state.json").read_text())
    assert stage_state["leader"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # the record names this boot
    os.kill(json.loads((run_dir / "state.json").read_text())["pid"], signal.SIGKILL)
    os.killpg(stage_state["pgid"], signal.SIGKILL)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        start_time = int(Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        leader = {"boot_id": "00000000-0000-0000-0000-000000000000", "start_time": start_time}  # all but the boot the stranger's
        (run_dir / "prepare" / "state.json").write_text(json.dumps({**stage_state, "pid": stranger.pid, "pgid": stranger.pid, "leader": leader}))
        _wait_for_status(lambda: jobs.status(run_id), "lost", key=lambda s: s.state)
        assert jobs.cancel_run(run_id).states[jobs.name] == "lost"
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_shell_on_host_runtime_is_a_pty_in_the_workdir(tmp_path):
    make_jobs(tmp_path, {})
    config = tmp_path / "project" / "harness.toml"
    keys = b'echo "cwd=$(pwd) tty=$(test -t 0 && echo yes) size=$(stty size)"; exit 4\n'
    code, out = run_in_pty([sys.executable, "-m", "harness", "--config", str(config), "shell", "box"], keys, rows=21, cols=77)
    assert code == 4, out
    assert f"cwd={tmp_path / 'work'} tty=yes size=21 77" in out


def test_cli_attached_run_exit_code_and_ctrl_c_detaches(tmp_path):
    make_jobs(tmp_path, {"prepare": {"lines": 2, "exit_code": 7}, "train": {"lines": 4, "sleep": 4}})
    config = tmp_path / "project" / "harness.toml"
    r = harness_cli(config, "run", "box", "prepare", "train")
    assert r.returncode == 1, r.stderr  # a failed run (harness.errors.EXIT_FAILED); the stage's 7 is in its status
    assert log_lines(r.stdout.split("\n", 1)[1]).count("prepare_data: line 2 of 2") == 1
    assert "failed" in r.stdout and "skipped" in r.stdout  # the final table
    # Ctrl-C while attached: detaches, says how to come back, the run goes on
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "run", "box", "train"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_id = proc.stdout.readline().decode().strip()
    seen = b""
    while b"line 1 of 4" not in seen:
        seen += proc.stdout.read1(4096)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert f"detached from run {run_id}" in err.decode() and f"harness logs box {run_id} -f" in err.decode()
    # SIGTERM (a closed terminal, a process manager) ends it as Ctrl-C does: what it holds is let go
    longer = harness_cli(config, "run", "box", "train", "--detach", "--set", "train.sleep=60").stdout.strip()
    follow = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", longer, "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    while b"line 1 of" not in seen:
        seen += follow.stdout.read1(4096)
    follow.send_signal(signal.SIGTERM)
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 130 and f"detached from run {longer}" in err.decode(), err
    harness_cli(config, "cancel", "box", longer)
    r = harness_cli(config, "logs", "box", run_id, "-f")
    assert log_lines(r.stdout) == expected_log("train_draft", 4)
    assert harness_cli(config, "status", "box", run_id).returncode == 0


# ---------------------------------------------------------------------------------------------


def _wait_for_line(jobs: Jobs, run_id: str, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in collect(jobs, run_id):
        assert time.monotonic() < deadline, f"no {text!r} in the log"
        time.sleep(0.2)


def _wait_for_status(read, wanted: str, key=lambda text: text, timeout: float = 60):
    """Poll read() until key(result) contains `wanted` (a generous deadline, not a fixed sleep:
    CI is a loaded 2-core machine); returns the last result."""
    deadline = time.monotonic() + timeout
    while wanted not in key(result := read()):
        assert time.monotonic() < deadline, f"never {wanted!r}: {result}"
        time.sleep(0.2)
    return result


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def assert_secret_absent(root: Path, secret: str) -> None:
    needle = secret.encode()
    for path in root.rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), f"secret found in {path}"


# ---------------------------------------------------------------------------------------------
# Over SSH (the real sshd test bed): the run outlives the connection AND the harness process.


def ssh_project(tmp_path: Path, ssh_host, stages: dict, **host_table) -> Path:
    """harness.toml with host `box` reached over SSH (alias from the test bed's ssh_config)."""
    return write_project(
        tmp_path / "project", tmp_path / "work", stages, host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5, **host_table}
    )


def sshd_session_pids(ssh_host) -> list[int]:
    """The per-connection sshd processes under the test bed's `box` daemon."""
    out = subprocess.run(["pgrep", "-P", str(ssh_host.box.proc.pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def kill_link_and_harness(proc: subprocess.Popen, ssh_host) -> None:
    """Cut every SSH connection on the server side, then SIGKILL harness and its process group."""
    for pid in sshd_session_pids(ssh_host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def start_attached_run(config, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`harness run box prepare train`, attached in its own process group (so killing the group
    is a closed laptop), read until the first stage has streamed its first line (the run is
    really going); returns (process, run id)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "--config", str(config), "run", "box", "prepare", "train"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env,
    )
    run_id = proc.stdout.readline().decode().strip()
    assert run_id, proc.stderr.read1(4096)
    seen = b""
    while b"line 1 of 3" not in seen:
        seen += proc.stdout.read1(4096)
    return proc, run_id


@pytest.mark.ssh
def test_ssh_run_survives_link_and_harness_kill_then_logs_f_is_complete(tmp_path, ssh_host):
    config = ssh_project(tmp_path, ssh_host, {"prepare": {"lines": 3, "sleep": 1.5}, "train": {"lines": 5, "sleep": 3}})
    proc, run_id = start_attached_run(config, ssh_host.env())
    before = sshd_session_pids(ssh_host)
    assert before, "no SSH connection to cut"
    kill_link_and_harness(proc, ssh_host)
    run_dir = tmp_path / "work" / "runs" / run_id
    # still going: the next stage, which the supervisor starts after the cut, writes its first line
    _wait_for_status(lambda: (run_dir / "train" / "log").read_text(errors="replace") if (run_dir / "train" / "log").exists() else "", "line 1 of 5")
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", run_id, "-f"], capture_output=True, text=True, timeout=90, env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    assert log_lines(r.stdout) == expected_log("prepare_data", 3) + expected_log("train_draft", 5)
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "status", "box", run_id], capture_output=True, text=True, timeout=60, env=ssh_host.env())
    assert r.returncode == 0 and "ok" in r.stdout


@pytest.mark.ssh
def test_ssh_cancel_exit_codes_and_secrets(tmp_path, ssh_host, monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    config_path = ssh_project(tmp_path, ssh_host, {"prepare": {"lines": 1, "print_env": SECRET_NAME, "exit_code": 4}, "train": {"lines": 100, "sleep": 100}}, env=[SECRET_NAME])
    config = load_config(config_path)
    host = config.host("box")
    with connect(host, ssh_host.connect_options()) as transport:
        jobs = Host(config, host, lambda _name: transport).jobs
        failed = jobs.launch(["prepare", "export"]).run_id
        long = jobs.launch(["train"], grace_s=1).run_id
        st = jobs.wait(failed, timeout=60)
        assert [(s.stage, s.state, s.exit_code) for s in st.stages] == [("prepare", "failed", 4), ("export", "skipped", None)]
        digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
        assert f"env {SECRET_NAME} sha256 {digest}" in collect(jobs, failed)
        _wait_for_line(jobs, long, "line 1 of 100")
        assert jobs.cancel_run(long).states[jobs.name] == "cancelled"
        assert jobs.status(long).stages[0].state == "cancelled"
    assert_secret_absent(tmp_path / "work", SECRET_VALUE)
    assert SECRET_VALUE not in ssh_host.box.log_text()  # nor in the sshd's (DEBUG) log


@pytest.mark.ssh
def test_ssh_attached_run_ctrl_c_detaches_and_the_run_goes_on(tmp_path, ssh_host):
    """Ctrl-C in the terminal (SIGINT to the whole foreground process group: harness and any ssh
    it started) while attached over SSH: harness detaches, says how to come back, and the run
    on the host finishes on its own."""
    config = ssh_project(tmp_path, ssh_host, {"prepare": {"lines": 3, "sleep": 1.5}, "train": {"lines": 5, "sleep": 3}})
    proc, run_id = start_attached_run(config, ssh_host.env())
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert f"detached from run {run_id}" in err.decode() and f"harness logs box {run_id} -f" in err.decode()
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", run_id, "-f"], capture_output=True, text=True, timeout=120, env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    assert log_lines(r.stdout) == expected_log("prepare_data", 3) + expected_log("train_draft", 5)
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "status", "box", run_id], capture_output=True, text=True, timeout=60, env=ssh_host.env())
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout


@pytest.mark.parametrize("where", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def test_harness_run_puts_no_secret_on_any_command_line(tmp_path, where, monkeypatch, request):
    """While `harness run` (attached) runs a stage that reads a secret, no process on this
    machine (harness, ssh, sshd's session, the supervisor, the stage: the host IS this machine)
    has the value on its command line; the stage still gets it."""
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    stages = {"prepare": {"lines": 4, "sleep": 3, "print_env": SECRET_NAME}}
    if where == "ssh":
        ssh_host = request.getfixturevalue("ssh_host")
        config, env = ssh_project(tmp_path, ssh_host, stages, env=[SECRET_NAME]), ssh_host.env()
    else:
        make_jobs(tmp_path, stages, host_table={"env": [SECRET_NAME]})
        config, env = tmp_path / "project" / "harness.toml", None
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "run", "box", "prepare"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen: list[str] = []
    while proc.poll() is None:
        seen += processes_showing(SECRET_VALUE.encode())
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert f"env {SECRET_NAME} sha256 {hashlib.sha256(SECRET_VALUE.encode()).hexdigest()}" in out.decode()  # delivered
    assert seen == []
    assert_secret_absent(tmp_path / "work", SECRET_VALUE)
