"""The production image, for real: container/Dockerfile with the ML install (INSTALL_ML=1, the
pinned stack from PyPI) on the offline debootstrap base, built by `harness build` over the test
sshd, then the demo chain run INSIDE it by `harness run` (runtime "docker"), to tau >= 3.5; and
`harness pull HOST last --latest-checkpoint` brings a checkpoint that speculators loads.

The first build takes minutes (pip downloads torch and its CUDA libraries, ~6.5 GB image); the
engine's layer cache makes an unchanged rebuild seconds, and a change to remote_scripts/ only
re-runs the last COPY."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.demo import DemoOptions, demo_config
from tests.fixtures.docker_engine import container_table
from tests.fixtures.job_project import run_artifact, toml_value
from tests.fixtures.pipeline_data import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.ssh, pytest.mark.pipeline]

REPO = Path(__file__).resolve().parents[1]
IMAGE = "harness-eagle3-ml-test"  # kept across sessions: its layers are the cache
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"  # pip in the image trusts what the host trusts (a TLS proxy)
MIN_TAU = 3.5


def pins() -> dict[str, str]:
    """name -> version from container/requirements.txt (what the image must hold)."""
    out = {}
    for line in (REPO / "container" / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0]
        if "==" in line:
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def write_config(root: Path, ssh_host, workdir: Path, base_image: str, memlock: int) -> Path:
    """The repository's container/ and remote_scripts/, a docker host over the test sshd, and the
    demo's pipeline (tiny verifier, threads tuned for 2 cores)."""
    for top in ("container", "remote_scripts"):
        shutil.copytree(REPO / top, root / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "extra-ca*.crt"))
    container = {**container_table(base_image, image=IMAGE), "build_args": {"INSTALL_ML": "1"}, "ulimits": {"memlock": memlock}}
    if Path(HOST_CA).is_file():
        container["ca_bundle"] = HOST_CA
    pipeline = demo_config(DemoOptions()).pipeline
    lines = ["[hosts.box]", f'ssh = "{ssh_host.alias}"', f'workdir = "{workdir}"', 'runtime = "docker"', "connect_timeout = 10", "[hosts.box.container]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in container.items()]
    lines += ["[sync]", 'paths = ["remote_scripts", "container"]', "[pipeline]"]
    lines += [f"{k} = {toml_value(getattr(pipeline, k))}" for k in ("verifier", "data", "output_dir", "max_seq_len", "speculative_tokens")]
    for stage, flags in pipeline.stages.items():
        lines.append(f"[pipeline.stages.{stage}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in flags.items()]
    path = root / "harness.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(2700)
def test_production_image_runs_the_demo_chain_and_pulls_a_loadable_checkpoint(tmp_path, ssh_host, docker_base_image):
    from tests.fixtures.docker_engine import startable_memlock

    workdir = tmp_path / "work"
    config = write_config(tmp_path, ssh_host, workdir, docker_base_image, startable_memlock())

    def harness(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, env=ssh_host.env(), timeout=timeout, cwd=tmp_path)

    built = harness("build", "box", timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:]
    # (the Dockerfile's check_lock.py and record_versions.py ran in this build or in the cached
    # layers it reused: the image exists only if they passed, and run.json shows what they wrote)
    assert harness("sync", "box").returncode == 0
    # what `harness tensorboard` runs on a docker host is in the image (container/requirements.txt)
    tensorboard = harness("exec", "box", "--", "python3", "-c", "import tensorboard; print(tensorboard.__version__)")
    assert tensorboard.returncode == 0 and tensorboard.stdout.strip() == pins()["tensorboard"], tensorboard.stderr[-2000:]

    run = harness("run", "box", "demo", timeout=1800)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    run_id = run.stdout.strip().splitlines()[0]
    run_dir = workdir / "runs" / run_id
    record = json.loads((run_dir / "run.json").read_text())
    assert record["runtime"] == "docker" and record["image"]["id"] == built.stdout.strip()
    expected = pins()
    image_versions = record["image"]["versions"]  # what the build recorded in /opt/harness/versions.json
    for name in ("torch", "transformers", "speculators"):
        assert image_versions[name].split("+")[0] == expected[name], image_versions
        assert record["versions"][name] == image_versions[name]  # what the stages saw
    assert image_versions["vllm"] is None
    for stage in record["stages"]:
        state = json.loads((run_dir / stage / "state.json").read_text())
        assert state["state"] == "ok" and state["exit_code"] == 0, (stage, state)
        # the stage really ran in the container: its log is the container's output
    report = json.loads((run_artifact(workdir, run_id, "evaluate") / "report.json").read_text())
    assert report["tau"] >= MIN_TAU, report

    local = tmp_path / "pulled"
    pulled = harness("pull", "box", "last", str(local), "--latest-checkpoint")
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert json.loads((local / "outputs" / "eval" / "report.json").read_text())["tau"] == report["tau"]
    assert (local / "outputs" / "eval" / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (local / "outputs" / "export" / "config.json").is_file() and (local / "run.json").is_file()
    epochs = sorted(int(p.name) for p in run_artifact(workdir, run_id, "train").iterdir() if p.name.isdigit() and not p.is_symlink())
    assert len(epochs) > 1  # the demo saves every epoch: the pull must pick the newest
    local_ckpts = local / "outputs" / "checkpoints"
    weights = sorted(os.path.relpath(os.path.join(d, f), local_ckpts) for d, _, files in os.walk(local_ckpts) for f in files if f == "model.safetensors")
    assert weights == [f"{epochs[-1]}/model.safetensors"]  # (speculators' descriptive links come along as links)
    checkpoint = local_ckpts / str(epochs[-1])
    assert load_checkpoint(checkpoint, workdir / "outputs" / "tiny-verifier")["forward_ok"] is True

