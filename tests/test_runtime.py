"""What the Runtime answers for its callers (jobs, exec, doctor, build, hosts), so none of them
compares runtime kinds: pure logic on the argv and specs it builds, and the host runtime's
foreground command run for real through the local transport."""

from __future__ import annotations

import os
import sys

import pytest

from harness.config import ContainerConfig, HostConfig
from harness.runtime import runtime_for
from harness.runtime.base import WrapOptions
from harness.runtime.docker import DockerRuntime
from harness.runtime.host import HostRuntime
from harness.transport.base import RunResult
from harness.transport.local import LocalTransport

HOST = HostConfig(name="box", local=True, workdir="~/w", python="python3")
DOCKER = HostConfig(name="gpu", ssh="me@gpu", workdir="~/w", runtime="docker", container=ContainerConfig(image="eagle", gpus=2))


class NoHost:
    """A transport that must not be asked anything."""

    name = "nohost"

    def run(self, argv, **kwargs) -> RunResult:
        raise AssertionError(f"unexpected command {argv}")

    def home(self) -> str:
        raise AssertionError("unexpected home() round trip")

    def expand(self, path: str) -> str:
        raise AssertionError("unexpected expand() round trip")


def test_the_configuration_alone_answers_without_a_host():
    host, docker = runtime_for(HOST), runtime_for(DOCKER)
    assert (host.uses_image, docker.uses_image) == (False, True)
    assert (HOST.runtime_label(), DOCKER.runtime_label()) == ("host", "docker (eagle)")
    assert (host.where, docker.where) == ("to the stage interpreter", "inside the container")
    assert "harness build gpu" in docker.install_fix() and "harness build" not in host.install_fix()
    assert (host.configured_gpu_count(), docker.configured_gpu_count()) == (None, 2)
    assert host.no_gpu_verdict(True) == ("warn", "") and docker.no_gpu_verdict(True) == ("fail", "")
    assert "NVIDIA runtime" in docker.no_gpu_verdict(False)[1]
    with pytest.raises(ValueError):
        host.workdir  # noqa: B018 - no transport: nothing expands it


@pytest.mark.parametrize("gpus, count", [("all", None), ("none", 0), (0, 0), (3, 3), ([1, 5], 2), ([], 0)])
def test_configured_gpu_count_of_a_container(gpus, count):
    runtime = DockerRuntime(HostConfig(name="g", local=True, runtime="docker", container=ContainerConfig(gpus=gpus)), "/w", home="/h")
    assert runtime.configured_gpu_count() == count
    if count is not None:
        assert runtime.gpu_count(NoHost()) == count  # configured: the host is not asked


def test_host_stage_process_is_a_process_group_in_the_workdir():
    runtime = HostRuntime(HostConfig(name="n", local=True, gpus=[1]), "/work")
    spec = runtime.stage_process(["python3", "s.py"], run_id="R", stage="train", log_path="/work/runs/R/train/log", options=WrapOptions(host_network=True))
    caches = {"TORCHINDUCTOR_CACHE_DIR": "/work/.harness/cache/torchinductor", "TRITON_CACHE_DIR": "/work/.harness/cache/triton",
              "VLLM_CACHE_ROOT": "/work/.harness/cache/vllm"}
    assert spec == {"kind": "host", "argv": runtime.wrap(["python3", "s.py"]), "env_defaults": caches}  # defaults: the host's env wins
    assert spec["argv"][3:] == ["/work", "env", "CUDA_VISIBLE_DEVICES=1", "python3", "s.py"]


def test_docker_stage_process_is_a_labelled_container_writing_its_log():
    runtime = DockerRuntime(DOCKER, "/home/me/w", home="/home/me", image="eagle:latest")
    options = WrapOptions(env_names=("HF_TOKEN",))
    spec = runtime.stage_process(["python3", "s.py"], run_id="R1", stage="train", log_path="/home/me/w/runs/R1/train/log", options=options)
    argv = spec["argv"]
    assert (spec["kind"], spec["container"]) == ("docker", "harness-R1-train")
    assert argv[:2] == ["docker", "create"] and "--network=host" not in argv
    assert argv[argv.index("--name") + 1] == "harness-R1-train"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--label"] == ["harness.workdir=/home/me/w", "harness.run=R1", "harness.stage=train"]
    # the box user's uid and gid (put in on the host), a private IPC namespace, HOME of its own
    assert argv[argv.index("--user") + 1] == "@harness-user@" and "--ipc=private" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-v"] == ["/home/me/w:/home/me/w", "/home/me/.cache/huggingface:/home/me/.cache/huggingface"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-e"] == ["HF_HOME=/home/me/.cache/huggingface", "HOME=/home/me/w/.harness/home", "PYTHONUNBUFFERED=1",
                                                                      "TORCHINDUCTOR_CACHE_DIR=/home/me/w/.harness/cache/torchinductor",
                                                                      "TRITON_CACHE_DIR=/home/me/w/.harness/cache/triton",
                                                                      "VLLM_CACHE_ROOT=/home/me/w/.harness/cache/vllm", "HF_TOKEN"]  # HF_TOKEN by name
    image_at = argv.index("eagle:latest")
    assert argv[image_at + 1:] == ["sh", "-c", 'umask 077; exec "$@" >>"$0" 2>&1', "/home/me/w/runs/R1/train/log", "python3", "s.py"]
    # a group's distributed stage: the host's network, first, so it reads as the mode of the container
    shared = runtime.stage_process(["python3", "s.py"], run_id="R1", stage="train", log_path="/l", options=WrapOptions(host_network=True))
    assert shared["argv"][:3] == ["docker", "create", "--network=host"]


def test_the_user_token_is_put_in_on_both_sides_of_the_seam():
    """The supervisor (stage containers) and foreground's shell (exec, shell, servers, probes) put the
    same token in for the box user's uid:gid, and nothing else that looks like it."""
    import subprocess

    from harness.host_helpers import supervisor
    from harness.runtime.base import USER_TOKEN

    assert supervisor.wire.USER_TOKEN is USER_TOKEN  # one constant, written once (host_helpers/wire.py)
    argv = DockerRuntime(DOCKER, "/home/me/w", home="/home/me", image="eagle:latest").foreground(["true"])
    assert argv[argv.index("--user") + 1] == USER_TOKEN
    # its shell, given no directories to make and `echo` for docker
    out = subprocess.run(["sh", "-c", argv[2], "sh", "0", "echo", "--user", USER_TOKEN, USER_TOKEN], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["--user", f"{os.getuid()}:{os.getgid()}", USER_TOKEN]


def test_a_runtime_asks_the_host_only_when_it_needs_to():
    """`harness exec` on a host runtime is one command: no round trip for the home directory
    (the warm path), the workdir expanded by the host's shell."""
    argv = runtime_for(HOST, NoHost()).foreground(["true"])
    assert argv[:2] == ["sh", "-c"] and argv[3:6] == ["sh", "~/w", "true"]


class Counting(LocalTransport):
    def __init__(self):
        super().__init__("box")
        self.homes = 0

    def home(self) -> str:
        self.homes += 1
        return super().home()


def test_workdir_and_home_are_asked_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    transport = Counting()
    runtime = runtime_for(DOCKER, transport)
    assert transport.homes == 0
    assert runtime.workdir == f"{tmp_path}/w" and runtime.home == str(tmp_path)
    runtime.foreground(["true"])
    assert transport.homes == 2  # one for the workdir, one for the mounts' ~; then kept


def test_host_foreground_creates_the_workdir_and_limits_the_gpus(tmp_path, monkeypatch):
    """Run for real: a fresh host (no workdir yet) runs the command in ~/w, created first, under
    the host's `gpus` as the stages see them."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    show = [sys.executable, "-c", "import os; print(os.getcwd(), os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]
    for gpus, expected in (([0, 2], "0,2"), ([], "unset")):
        host = HostConfig(name="box", local=True, workdir="~/w", gpus=gpus)
        result = LocalTransport("box").run(runtime_for(host, NoHost()).foreground(show))
        assert result.ok, result.stderr
        assert result.text.split() == [os.path.realpath(tmp_path / "w"), expected]


def test_build_asks_the_runtime_whether_there_is_an_image(tmp_path):
    """`harness build` on a host (or a group) whose stages run without an image: one line, exit
    2, nothing reached (the docker host below does not exist)."""
    import subprocess

    (tmp_path / "harness.toml").write_text('[hosts.gpu]\nssh = "u@unreachable.invalid"\nruntime = "docker"\n[hosts.plain]\nlocal = true\n[groups.g]\nhosts = ["gpu", "plain"]\n')
    for target, expected in (
        ("plain", 'harness: error: host plain has runtime = "host"; set runtime = "docker" in [hosts.plain] to build an image'),
        ("g", 'harness: error: group g: host(s) plain have runtime = "host"; nothing to build there'),
    ):
        r = subprocess.run([sys.executable, "-m", "harness", "build", target], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert (r.returncode, r.stderr.strip().splitlines()) == (2, [expected]), r.stderr
