"""How many ranks torchrun starts on a host: nvidia-smi's list, limited by CUDA_VISIBLE_DEVICES."""

from harness.jobs import visible_gpu_count

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
