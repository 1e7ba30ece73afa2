"""DockerRuntime against a real Docker engine: the container's HostConfig, and detached runs with
a container per stage (same job semantics as runtime = "host", see test_jobs.py).

No GPU here, so GPU options are asserted on `docker create` + `docker inspect` without starting
the container: a DeviceRequest is only resolved (and fails without the NVIDIA runtime) at start.
That failure is itself tested: a job with GPUs configured fails with docker's reason in its log.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.host import Host
from harness.jobs import Jobs
from harness.runtime import runtime_for
from harness.runtime.base import WrapOptions
from harness.transport import connect
from tests.fixtures.docker_engine import container_table
from tests.fixtures.job_project import expected_log, log_lines, run_in_pty, write_project
from tests.test_jobs import SECRET_NAME, SECRET_VALUE, assert_secret_absent, collect

pytestmark = pytest.mark.docker


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=check)


def docker_jobs(tmp_path: Path, base_image: str, stages: dict, host_table: dict | None = None, **container) -> tuple[Jobs, Path]:
    workdir = tmp_path / "work"
    config_path = write_project(
        tmp_path / "project", workdir, stages, host_table={"runtime": "docker", **(host_table or {})}, container=container_table(base_image, **container)
    )
    config = load_config(config_path)
    host = config.host("box")
    transport = connect(host)
    return Host(config, host, lambda _name: transport).jobs, workdir


@pytest.mark.parametrize(
    "gpus, expected",
    [
        ("all", {"Count": -1, "DeviceIDs": None}),
        (2, {"Count": 2, "DeviceIDs": None}),
        ([0, 3], {"Count": 0, "DeviceIDs": ["0", "3"]}),
    ],
)
def test_container_host_config(tmp_path, docker_base_image, gpus, expected, monkeypatch):
    data = tmp_path / "data"
    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    config = load_config(
        write_project(
            tmp_path / "project",
            tmp_path / "work",
            {},
            host_table={"runtime": "docker", "data_dir": str(data), "env": [SECRET_NAME]},
            container=container_table(docker_base_image, gpus=gpus, shm_size="2g", mounts=[f"{extra}:/extra:ro"], ulimits={}),  # production defaults
        )
    )
    host = config.host("box")
    transport = connect(host)
    runtime = runtime_for(host, transport)
    runtime.image = docker_base_image
    name = f"harness-inspect-{os.getpid()}-{len(str(gpus))}"
    argv = runtime.create_argv(["true"], WrapOptions(labels=(("run", "R1"), ("stage", "train")), name=name))
    # docker reads the secret from ITS environment (-e NAME): not on the command line
    assert SECRET_VALUE not in " ".join(argv) and ["-e", SECRET_NAME] == argv[argv.index(SECRET_NAME) - 1 : argv.index(SECRET_NAME) + 1]
    user = f"{os.getuid()}:{os.getgid()}"
    argv[argv.index("--user") + 1] = user  # as the supervisor puts it in on the host
    assert transport.run(argv, env={SECRET_NAME: SECRET_VALUE}).exit_code == 0
    try:
        info = json.loads(docker("inspect", name).stdout)[0]
    finally:
        docker("rm", "-f", name)
    hc = info["HostConfig"]
    (request,) = hc["DeviceRequests"]
    assert request["Capabilities"] == [["gpu"]]
    assert {k: request[k] for k in expected} == expected
    assert hc["IpcMode"] == "private" and info["Config"]["User"] == user  # no other uid's shared memory; the box user's files
    assert hc["ShmSize"] == 2 * 1024**3  # takes effect: the container's own /dev/shm
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {"memlock": (-1, -1), "stack": (67108864, 67108864)}
    assert hc["Init"] is True
    work = str(tmp_path / "work")
    assert set(hc["Binds"]) == {f"{work}:{work}", f"{data}:{data}", f"{runtime.hf_cache}:{runtime.hf_cache}", f"{extra}:/extra:ro"}
    assert info["Config"]["WorkingDir"] == work
    assert info["Config"]["Labels"]["harness.run"] == "R1" and info["Config"]["Labels"]["harness.stage"] == "train"
    assert f"{SECRET_NAME}={SECRET_VALUE}" in info["Config"]["Env"]  # passed through by name


def test_gpu_job_without_gpu_fails_with_dockers_reason(tmp_path, harness_test_image, docker_base_image):
    jobs, workdir = docker_jobs(tmp_path, docker_base_image, {}, gpus="all")
    run_id = jobs.launch(["prepare", "train"]).run_id
    status = jobs.wait(run_id, timeout=60)
    assert status.state == "failed" and status.stages[0].state == "failed" and status.stages[0].exit_code != 0
    assert status.stages[1].state == "skipped"
    assert "could not select device driver" in collect(jobs, run_id, "prepare")


def test_docker_chain_logs_record_labels_and_cleanup(tmp_path, harness_test_image, docker_base_image):
    jobs, workdir = docker_jobs(tmp_path, docker_base_image, {"prepare": {"lines": 3, "sleep": 3}, "train": {"lines": 2}})
    run_id = jobs.launch(["prepare", "train"]).run_id
    # while it runs: one container, labelled with run and stage
    deadline = time.monotonic() + 20
    while not (names := docker("ps", "--filter", f"label=harness.run={run_id}", "--format", '{{.Names}} {{.Label "harness.stage"}}').stdout.split()):
        assert time.monotonic() < deadline, "no container for the run"
        time.sleep(0.2)
    assert names == [f"harness-{run_id}-prepare", "prepare"]
    status = jobs.wait(run_id, timeout=90)
    assert status.state == "ok", collect(jobs, run_id)
    assert [(s.stage, s.state, s.exit_code) for s in status.stages] == [("prepare", "ok", 0), ("train", "ok", 0)]
    text = collect(jobs, run_id)
    assert log_lines(text) == expected_log("prepare_data", 3) + expected_log("train_draft", 2)
    assert f"cwd {workdir}" in text  # the workdir is mounted at the same path and is the cwd
    record = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    assert record["image"] == {"ref": "harness-eagle3-test:latest", "id": harness_test_image, "versions": {"torch": None, "transformers": None, "speculators": None, "vllm": None}}
    assert record["versions"] == {"torch": None, "transformers": None, "speculators": None, "vllm": None}  # INSTALL_ML=0
    assert record["runtime"] == "docker"
    # containers are removed once their exit code is recorded
    assert docker("ps", "-a", "--filter", f"label=harness.run={run_id}", "-q").stdout.strip() == ""


def test_docker_exit_code_cancel_and_secrets(tmp_path, harness_test_image, docker_base_image, monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    jobs, workdir = docker_jobs(tmp_path, docker_base_image, {"prepare": {"lines": 1, "exit_code": 3, "print_env": SECRET_NAME}}, host_table={"env": [SECRET_NAME]})
    failed = jobs.launch(["prepare", "train"]).run_id
    # a second run at the same time, to be cancelled: runs never collide
    jobs2, _ = docker_jobs(tmp_path, docker_base_image, {"prepare": {"lines": 100, "sleep": 100}})
    long = jobs2.launch(["prepare", "train"], grace_s=2).run_id
    status = jobs.wait(failed, timeout=60)
    assert [(s.stage, s.state, s.exit_code) for s in status.stages] == [("prepare", "failed", 3), ("train", "skipped", None)]
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    assert f"env {SECRET_NAME} sha256 {digest}" in collect(jobs, failed)
    deadline = time.monotonic() + 60
    while "line 1 of 100" not in collect(jobs2, long):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    t0 = time.monotonic()
    assert jobs2.cancel_run(long).states[jobs2.name] == "cancelled"
    assert time.monotonic() - t0 < 60  # SIGTERM ended it, no 100 s wait (generous: loaded CI)
    st = jobs2.status(long)
    assert [(s.stage, s.state) for s in st.stages] == [("prepare", "cancelled"), ("train", "cancelled")]
    assert st.stages[0].exit_code == 128 + signal.SIGTERM  # docker-init passed the SIGTERM on
    assert docker("ps", "-a", "--filter", f"label=harness.run={long}", "-q").stdout.strip() == ""
    assert_secret_absent(workdir, SECRET_VALUE)


def test_docker_run_survives_killing_harness(tmp_path, harness_test_image, docker_base_image):
    docker_jobs(tmp_path, docker_base_image, {"prepare": {"lines": 3, "sleep": 2}, "train": {"lines": 4, "sleep": 2}})
    config = tmp_path / "project" / "harness.toml"
    from tests.test_jobs import start_attached_run

    proc, run_id = start_attached_run(config)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", run_id, "-f"], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert log_lines(r.stdout) == expected_log("prepare_data", 3) + expected_log("train_draft", 4)


def test_shell_is_a_real_pty_in_the_container_with_job_mounts(tmp_path, harness_test_image, docker_base_image):
    docker_jobs(tmp_path, docker_base_image, {})
    config = tmp_path / "project" / "harness.toml"
    keys = b'echo "cwd=$(pwd) tty=$(test -t 0 && echo yes) size=$(stty size) hf=$HF_HOME"; exit 3\n'
    code, out = run_in_pty([sys.executable, "-m", "harness", "--config", str(config), "shell", "box"], keys)
    assert code == 3, out
    assert f"cwd={tmp_path / 'work'} tty=yes size=33 101 hf={Path.home()}/.cache/huggingface" in out


def test_exec_runs_in_the_container(tmp_path, harness_test_image, docker_base_image):
    docker_jobs(tmp_path, docker_base_image, {})
    config = tmp_path / "project" / "harness.toml"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "--config", str(config), "exec", "box", "--", "sh", "-c", 'echo "$(pwd) $HARNESS_SCRIPTS"; exit 5'],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 5, r.stderr
    assert r.stdout.strip() == f"{tmp_path / 'work'} /opt/harness/remote_scripts"  # HARNESS_SCRIPTS: set by the image


@pytest.mark.ssh
def test_ssh_docker_run_survives_link_and_harness_kill(tmp_path, ssh_host, harness_test_image, docker_base_image):
    from tests.test_jobs import kill_link_and_harness, start_attached_run

    config = write_project(
        tmp_path / "project", tmp_path / "work", {"prepare": {"lines": 3, "sleep": 2}, "train": {"lines": 4, "sleep": 3}},
        host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5, "runtime": "docker"}, container=container_table(docker_base_image),
    )
    proc, run_id = start_attached_run(config, ssh_host.env())
    kill_link_and_harness(proc, ssh_host)
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "logs", "box", run_id, "-f"], capture_output=True, text=True, timeout=120, env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    assert log_lines(r.stdout) == expected_log("prepare_data", 3) + expected_log("train_draft", 4)
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "status", "box", run_id], capture_output=True, text=True, timeout=60, env=ssh_host.env())
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout


@pytest.mark.ssh
def test_ssh_shell_in_the_container(tmp_path, ssh_host, harness_test_image, docker_base_image):
    config = write_project(
        tmp_path / "project", tmp_path / "work", {},
        host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5, "runtime": "docker"}, container=container_table(docker_base_image),
    )
    keys = b'echo "cwd=$(pwd) tty=$(test -t 0 && echo yes) size=$(stty size) img=$HARNESS_SCRIPTS"; exit 6\n'
    env_argv = ["env", *(f"{k}={v}" for k, v in ssh_host.env({}).items())]
    code, out = run_in_pty([*env_argv, sys.executable, "-m", "harness", "--config", str(config), "shell", "box"], keys, rows=40, cols=90)
    assert code == 6, out
    assert f"cwd={tmp_path / 'work'} tty=yes size=40 90 img=/opt/harness/remote_scripts" in out


MEMORY_HOG = """import os, sys, time
go = sys.argv[sys.argv.index("--until-file") + 1]
print("waiting", flush=True)
while not os.path.exists(go):
    time.sleep(0.1)
hog = bytearray(512 * 2**20)  # touched page by page: more than the container's limit
for i in range(0, len(hog), 4096):
    hog[i] = 1
print("survived", flush=True)
"""


def test_out_of_memory_is_told_apart_from_a_kill(tmp_path, harness_test_image, docker_base_image):
    """Both read exit 137; only the engine knows the kernel's OOM kill (State.OOMKilled), and the
    supervisor used to remove the container before anyone read it. The limit is put on the
    running stage's container from outside (`docker update`: the config has no memory key)."""
    runs = {}
    for case in ("oom", "killed"):
        go = tmp_path / case / "work" / "go"
        jobs, workdir = docker_jobs(tmp_path / case, docker_base_image, {"prepare": {"until_file": str(go)}})
        (workdir / "remote_scripts" / "prepare_data.py").write_text(MEMORY_HOG)
        runs[case] = (jobs, jobs.launch(["prepare"]).run_id, go)
    for case, (jobs, run_id, go) in runs.items():
        deadline = time.monotonic() + 60
        while "waiting" not in collect(jobs, run_id):
            assert time.monotonic() < deadline, collect(jobs, run_id)
            time.sleep(0.2)
        name = f"harness-{run_id}-prepare"
        if case == "oom":
            docker("update", "--memory", "64m", "--memory-swap", "64m", name)
            go.touch()
        else:
            docker("kill", name)
    for case, (jobs, run_id, _) in runs.items():
        status = jobs.wait(run_id, timeout=60)
        stage = status.stages[0]
        assert (stage.state, stage.exit_code) == ("failed", 137), collect(jobs, run_id)
        error = (stage.last_event or {}).get("error") or ""
        if case == "oom":
            assert error.startswith("out of memory: the kernel killed the stage's container (exit 137)"), stage.last_event
            assert "harness: out of memory" in collect(jobs, run_id)
        else:
            assert "out of memory" not in error and "out of memory" not in collect(jobs, run_id)
        assert docker("ps", "-a", "--filter", f"label=harness.run={run_id}", "-q").stdout.strip() == ""
