"""How many ranks torchrun starts on a host: nvidia-smi's list, limited by CUDA_VISIBLE_DEVICES."""

import os

from harness.runtime.base import visible_gpu_count

SMI = "GPU 0: NVIDIA H200 (UUID: a)\nGPU 1: NVIDIA H200 (UUID: b)\n"


def test_all_gpus_when_unset():
    assert visible_gpu_count("all\n" + SMI) == 2


def test_cuda_visible_devices_limits():
    assert visible_gpu_count("1\n" + SMI) == 1
    assert visible_gpu_count("0,1\n" + SMI) == 2


def test_hidden_or_absent_gpus():
    assert visible_gpu_count("\n" + SMI) == 0
    assert visible_gpu_count("-1\n" + SMI) == 0
    assert visible_gpu_count("all\n") == 0


def test_the_probe_sees_the_gpus_the_stages_see(tmp_path, monkeypatch):
    """torchrun's rank count on a host-runtime host: its `gpus` limit nvidia-smi's list exactly
    as they limit the stages (the same CUDA_VISIBLE_DEVICES), else the inherited environment
    does. A stand-in nvidia-smi listing four GPUs (there is no GPU here); the probe itself runs
    for real through the local transport."""
    from harness.config import load_config
    from harness.host import Host
    from harness.transport.local import LocalTransport

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: g{i})'\n" for i in range(4)))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    toml = tmp_path / "harness.toml"
    toml.write_text(f'[hosts.pair]\nlocal = true\nworkdir = "{tmp_path}"\ngpus = [1, 3]\n[hosts.box]\nlocal = true\nworkdir = "{tmp_path}"\n')
    config = load_config(toml)

    def ranks(host: str) -> int:
        return Host(config, config.host(host), LocalTransport).jobs._preflight(gpu_count=True)[1]

    assert ranks("pair") == 2
    assert ranks("box") == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert ranks("box") == 1
    assert ranks("pair") == 2  # the host's `gpus` win over what the environment says
