"""The ML checks of `harness doctor`: every check's ok / warn / fail verdict, through a fake
command runner that answers the probe, df and docker as a host would (pure logic: the facts are
canned, the gathering, parsing and verdicts are the real code); the compatibility matrix; the
probe script itself on this machine; and one doctor run end to end over the sshd test bed
against the test Docker engine."""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from harness import compat
from harness.config import parse_config
from harness.doctor.ml_checks import PROBE_MARKER, MLDoctor, hidden_state_bytes
from harness.runtime import runtime_for
from harness.runtime.preflight import VERSIONS_FILE
from harness.runtime.host import HostRuntime
from harness.transport.base import RunResult

GIB = 2**30

# What ml_probe.py reports on a healthy 2 x H100 host with the pinned stack.
HEALTHY: dict[str, Any] = {
    "python": "3.12.3",
    "executable": "/usr/bin/python3",
    "versions": {"torch": "2.14.0+cu129", "transformers": "5.19.0", "speculators": "0.9.0", "vllm": "0.33.0", "triton": "3.7.0", "datasets": "5.1.0", "safetensors": "0.8.0"},
    "nvidia_smi": {"found": True, "exit_code": 0, "gpus": [["NVIDIA H100 80GB HBM3", "580.65.06"]] * 2, "error": ""},
    "torch": {"version": "2.14.0+cu129", "cuda_version": "12.9", "cuda_available": True, "devices": [{"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "total_memory": 85 * GIB, "smem_per_block_optin": 232448}] * 2},
    "flex": {"status": "ok", "device": "cuda", "head_dim": 128, "elapsed_s": 21.4},
    "verifier": {"path": "models/llama", "found": True, "model_type": "llama", "nested_text_config": False, "text_model_type": "llama", "dtype": "bfloat16", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128},
    "samples": {"count": 10000, "source": "rows of the prepared dataset outputs/prepared"},
    "private_network": {"allowed": False, "reason": "no network namespace of its own: unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted"},
    "elapsed_s": 30.1,
}


def facts(**changes: Any) -> dict[str, Any]:
    """HEALTHY with nested changes: facts(torch={"cuda_available": False}) merges into torch."""
    out = copy.deepcopy(HEALTHY)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


class FakeHost:
    """A command runner answering like a host: the ML probe (through the runtime), df,
    `docker image inspect` (both image tags exist unless `images` says otherwise), and the
    container start check (`start_error`: docker's stderr when it fails). Records every argv."""

    def __init__(self, probe: dict | None = None, *, probe_error: str = "", free_gib: dict[str, float] | None = None, images: dict[str, str] | None = None, start_error: str = ""):
        self.probe, self.probe_error = probe, probe_error
        self.free_gib = free_gib or {}
        self.images = {ref: "sha256:aaa" for ref in IMAGE_REFS} if images is None else images
        self.start_error = start_error
        self.calls: list[list[str]] = []
        self.name = "gpu"

    def home(self) -> str:
        return "/home/me"

    def expand(self, path: str) -> str:
        return self.home() + path[1:] if path.startswith("~") else path

    def run(self, argv: Sequence[str], **kwargs) -> RunResult:
        argv = list(argv)
        self.calls.append(argv)
        if PROBE_MARKER.strip().encode() in (kwargs.get("stdin") or b""):  # the probe script arrives on stdin (harness.helpers), however wrapped
            if self.probe is None:
                return RunResult(125, b"", self.probe_error.encode())
            return RunResult(0, b"torch says hello on stdout\n" + (PROBE_MARKER + json.dumps(self.probe) + "\n").encode(), b"")
        if argv[:2] == ["sh", "-c"] and "df -Pk" in argv[2]:
            lines = []
            for path in argv[5:]:
                gib = self.free_gib.get(path, 2000.0)
                existing = path if path.startswith("/") else f"/home/me/harness/{path}"
                lines.append(f"{path}\t{existing}\t/dev/nvme0n1 1000000000 1 {int(gib * 2**20)} 1% /")
            return RunResult(0, ("\n".join(lines) + "\n").encode(), b"")
        if argv[:2] == ["docker", "run"] and argv[-2:] == ["cat", "/proc/self/limits"]:  # the engine's limits
            return RunResult(0, ENGINE_LIMITS.encode(), b"")
        if "docker" in argv and any(VERSIONS_FILE in a for a in argv):  # the start check
            if self.start_error:
                return RunResult(125, b"", self.start_error.encode())
            return RunResult(0, json.dumps({"torch": "2.14.0+cu129", "vllm": "0.33.0"}).encode() + b"\n", b"")
        if argv[:3] == ["docker", "image", "inspect"]:
            ref = argv[-1]
            if ref in self.images:
                return RunResult(0, (self.images[ref] + "\n").encode(), b"")
            return RunResult(1, b"", f"Error: No such image: {ref}\n".encode())
        raise AssertionError(f"unexpected command {[a[:80] for a in argv]}")

    def stream(self, argv: Sequence[str], **kwargs) -> "FakeProcess":
        """How harness.helpers starts a helper (the probe): answered as run() answers, once the
        caller has written the helper's source and request and closed stdin."""
        return FakeProcess(self, list(argv))


class FakeProcess:
    """A RemoteProcess as helpers.call uses it, whose command is FakeHost.run's."""

    def __init__(self, host: FakeHost, argv: list[str]):
        self.host, self.argv, self.written = host, argv, b""
        self.result: RunResult | None = None
        self.stdin, self.stdout = self, io.BytesIO()

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.result = self.host.run(self.argv, stdin=self.written)
        self.stdout = io.BytesIO(self.result.stdout)

    def wait(self, timeout: float | None = None) -> int:
        return self.result.exit_code

    def stderr_text(self) -> str:
        return self.result.stderr.decode()

    def kill(self) -> None:
        pass

    def error(self, what: str):
        from harness.errors import RemoteCommandError

        return RemoteCommandError(what, self.result.exit_code, self.stderr_text())


def project(host: str = "", pipeline: str = "", train: str = "", verifier: str = "models/llama") -> Any:
    text = f"""
[hosts.gpu]
ssh = "me@gpu"
workdir = "~/harness"
runtime = "docker"
{host}
[pipeline]
verifier = "{verifier}"
max_seq_len = 2048
{pipeline}
[pipeline.stages.train]
{train}
"""
    import tomllib

    return parse_config(tomllib.loads(text), Path("/project/harness.toml"))


IMAGE_REFS = ("harness-eagle3:abc123", "harness-eagle3:latest")
ENGINE_LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max stack size            8388608              unlimited            bytes
Max open files            20000                20000                files
Max locked memory         8388608              8388608              bytes
"""
RUNC_RLIMIT_8 = (
    "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container "
    "process: error during container init: error setting rlimits for ready process: error setting rlimit type 8: operation not permitted: unknown\n\n"
    "Run 'docker run --help' for more information\n"
)


def run_checks(runner: FakeHost, config=None, **host_changes) -> dict[str, Any]:
    """name -> CheckResult for every ML check, gathered through `runner`."""
    config = config or project()
    host = config.host("gpu")
    if host_changes:
        import dataclasses

        host = dataclasses.replace(host, **host_changes)
    doctor = MLDoctor(config, host, runtime_for(host, runner), image_ref_factory=lambda c, h: IMAGE_REFS)
    from harness.doctor.base import run_checks as run_all

    return {r.name: r for r in run_all(runner, host, doctor.checks())}


def verdict(results, name):
    r = results[name]
    return r.status, r.message, r.fix


# ---------------------------------------------------------------------------------------------


def test_healthy_host_is_all_ok_in_one_probe_round_trip():
    runner = FakeHost(HEALTHY, images={IMAGE_REFS[0]: "sha256:aaa", IMAGE_REFS[1]: "sha256:aaa"})
    results = run_checks(runner)
    assert {n: r.status for n, r in results.items()} == {
        "image": "ok", "container": "ok", "stage-gpus": "ok", "versions": "ok", "flex-attention": "ok", "verifier": "ok",
        "verifier-dtype": "ok", "verifier-code": "ok", "verifier-quantization": "ok", "target-layers": "ok",
        "hidden-state-disk": "ok", "train-settings": "ok", "vllm-network": "ok",
    }
    probes = [c for c in runner.calls if "ml_probe.py" in c]
    # through the runtime, once, after creating the directories the container mounts
    assert len(probes) == 1 and probes[0][:2] == ["sh", "-c"]
    assert probes[0][3:11] == ["sh", "3", "/home/me/harness", "/home/me/.cache/huggingface", "/home/me/harness/.harness/home", "docker", "run", "--rm"]
    # + df once + docker image inspect of the two tags + the start check (inspect, run)
    assert len(runner.calls) == 6
    assert results["stage-gpus"].message == "2 GPU(s) visible inside the container: NVIDIA H100 80GB HBM3 (driver 580.65.06); torch 2.14.0+cu129 (CUDA 12.9) uses them (sm_90)"
    assert results["target-layers"].message == "speculators' default [2, N//2, N-3] = [2, 16, 29] (N = 32)"
    assert "227 KiB shared memory per block" in results["flex-attention"].message


def test_hidden_state_disk_sizes_the_run():
    need = hidden_state_bytes(10000, 2048, 4, 4096)
    assert need == 10000 * 2048 * 4 * 4096 * 2  # samples x seq_len x (k+1) x hidden x 2 bytes
    need_gib = need / GIB  # 625 GiB
    ok = run_checks(FakeHost(HEALTHY, free_gib={"outputs/artifacts/extract": need_gib * 1.5}))
    status, message, _ = verdict(ok, "hidden-state-disk")
    assert status == "ok" and message.startswith("hidden states need 10000 samples x 2048 tokens x 4 layers x 4096 x 2 B = 625.00 GiB at most")
    tight = run_checks(FakeHost(HEALTHY, free_gib={"outputs/artifacts/extract": need_gib * 1.1}))
    assert tight["hidden-state-disk"].status == "warn"
    full = run_checks(FakeHost(HEALTHY, free_gib={"outputs/artifacts/extract": 100, "/data": 4000}), data_dir="/data")
    status, message, fix = verdict(full, "hidden-state-disk")
    assert status == "fail" and "100.0 GiB free" in message and "data_dir /data has 4000.0 GiB free" in fix
    assert "[pipeline.stages.train] online = true" in fix  # the option that needs no such disk
    # online: nothing stored; the per-row need and the offline total it avoids, both named
    online = run_checks(FakeHost(HEALTHY, free_gib={"outputs/artifacts/extract": 100}), project(train="online = true"))
    status, message, _ = verdict(online, "hidden-state-disk")
    assert status == "ok" and message.startswith("training online: no hidden states stored (offline they would need 10000 samples x 2048 tokens")
    assert f"one row's, {2048 * 4 * 4096 * 2 / 2**20:.2f} MiB" in message and "100.0 GiB free" in message
    # explicit target layers change k
    five = run_checks(FakeHost(HEALTHY, free_gib={"outputs/artifacts/extract": 10_000}), project(pipeline="target_layer_ids = [1, 5, 9, 13, 20]"))
    assert "x 6 layers x" in five["hidden-state-disk"].message
    unknown = run_checks(FakeHost(facts(samples={"count": None, "source": "neither prepared data nor chat data exist yet"})))
    status, message, fix = verdict(unknown, "hidden-state-disk")
    assert status == "warn" and "cannot size the hidden states yet" in message and "prepare" in fix


def test_gpus_in_the_container():
    no_toolkit = run_checks(FakeHost(None, probe_error='docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'))
    status, message, fix = verdict(no_toolkit, "stage-gpus")
    assert status == "fail" and "cannot get a GPU" in message and "NVIDIA Container Toolkit" in fix
    # everything that needs the probe says so instead of guessing
    assert no_toolkit["versions"].status == "warn" and no_toolkit["versions"].message.startswith("not checked")
    no_image = run_checks(FakeHost(None, probe_error="Unable to find image 'harness-eagle3:latest' locally"))
    assert verdict(no_image, "stage-gpus")[0::2] == ("fail", "harness build gpu")
    cpu_torch = run_checks(FakeHost(facts(torch={"version": "2.14.0+cpu", "cuda_version": None, "cuda_available": False, "devices": []})))
    status, message, _ = verdict(cpu_torch, "stage-gpus")
    assert status == "fail" and "torch is a CPU-only build" in message
    mismatch = run_checks(FakeHost(facts(torch={"devices": HEALTHY["torch"]["devices"][:1]})))
    assert mismatch["stage-gpus"].status == "warn" and "torch sees 1" in mismatch["stage-gpus"].message
    none_requested = run_checks(FakeHost(facts()), project(host='[hosts.gpu.container]\ngpus = "none"'))
    assert none_requested["stage-gpus"].status == "warn"
    nothing = run_checks(FakeHost(facts(nvidia_smi={"found": False, "exit_code": 127, "gpus": [], "error": "nvidia-smi not found"})))
    assert nothing["stage-gpus"].status == "fail" and "NVIDIA runtime" in nothing["stage-gpus"].message


def test_image_built_and_current():
    current, latest = IMAGE_REFS
    assert run_checks(FakeHost(HEALTHY, images={current: "sha256:1", latest: "sha256:1"}))["image"].status == "ok"
    stale = run_checks(FakeHost(HEALTHY, images={current: "sha256:1", latest: "sha256:0"}))
    assert verdict(stale, "image")[0::2] == ("warn", "harness build gpu (re-tags, nothing rebuilds)")
    missing = run_checks(FakeHost(HEALTHY, images={latest: "sha256:0"}))
    status, message, fix = verdict(missing, "image")
    assert status == "fail" and current in message and fix == "harness build gpu"
    assert run_checks(FakeHost(HEALTHY), runtime="host")["image"].status == "ok"


def test_before_the_first_build_no_container_is_started():
    """No :latest on the host: the container check says "not built" in one line, and neither it
    nor the probe runs a container (docker would try a registry for a missing image)."""
    runner = FakeHost(HEALTHY, images={})
    results = run_checks(runner)
    status, message, fix = verdict(results, "container")
    assert (status, message, fix) == ("fail", "gpu: harness-eagle3:latest not built: harness build gpu", "harness build gpu")
    assert verdict(results, "stage-gpus")[0::2] == ("fail", "harness build gpu")
    assert results["image"].message.startswith("harness-eagle3:abc123 not built: harness build gpu")
    assert not [c for c in runner.calls if c[:2] == ["docker", "run"] or "docker" in " ".join(c[3:10])]


def test_an_engine_refusing_the_ulimits_is_one_line_naming_them():
    results = run_checks(FakeHost(HEALTHY, start_error=RUNC_RLIMIT_8))
    status, message, fix = verdict(results, "container")
    assert status == "fail"
    assert message == "gpu: the Docker engine refused container.ulimits memlock = -1: the host's hard limit for memlock is 8388608"
    assert fix == "set hosts.gpu.container.ulimits = { memlock = 8388608 } or raise the engine's limit (e.g. LimitMEMLOCK= in docker.service)"
    assert verdict(results, "stage-gpus")[0::2] == ("fail", "see the container check")


def test_image_tag_is_the_content_hash_of_container(tmp_path):
    """Without the injected refs: the tag harness build would give container/ right now."""
    from harness.runtime.image import gather_inputs
    from tests.fixtures.job_project import write_build_context, write_project

    from harness.transport.local import LocalTransport

    write_build_context(tmp_path)
    config = parse_config_file(write_project(tmp_path, tmp_path / "work", {}, host_name="gpu", host_table={"runtime": "docker"}))
    host = config.host("gpu")
    tag = gather_inputs(config, host).content_hash
    doctor = MLDoctor(config, host, runtime_for(host, LocalTransport()))
    assert doctor.image_refs(LocalTransport()) == (f"harness-eagle3:{tag}", "harness-eagle3:latest")


def parse_config_file(path: Path):
    from harness.config import load_config

    return load_config(path)


@pytest.mark.parametrize(
    ("versions", "status", "text"),
    [
        ({}, "ok", "torch==2.14.0+cu129, transformers==5.19.0, speculators==0.9.0, vllm==0.33.0"),
        ({"torch": "2.15.0"}, "fail", "speculators 0.9.0 needs torch>=2.9.0,<=2.14.1, found 2.15.0"),
        ({"transformers": "5.20.0"}, "fail", "speculators 0.9.0 needs transformers>=5.0.0,<=5.19.0, found 5.20.0"),
        ({"torch": "2.14.1"}, "fail", "vllm 0.33.0 needs torch==2.14.0, found 2.14.1"),
        ({"transformers": "5.16.0"}, "fail", "vllm 0.33.0 needs transformers>=5.16.1,<5.21, found 5.16.0"),
        ({"speculators": None}, "fail", "not installed: speculators"),
        ({"vllm": None, "torch": "2.13.0+cpu"}, "ok", "(no vllm: the transformers extraction backend only)"),
        ({"speculators": "0.10.0"}, "warn", "not in the compatibility matrix: speculators 0.10.0"),
    ],
)
def test_library_versions_against_the_matrix(versions, status, text):
    results = run_checks(FakeHost(facts(versions=versions)))
    assert results["versions"].status == status and text in results["versions"].message
    if status == "fail":
        assert results["versions"].fix == "pin the versions in container/requirements.txt and run harness build gpu"


def test_torch_that_does_not_import_fails_versions():
    results = run_checks(FakeHost(facts(torch={"import_error": "OSError: libcudnn.so.9: cannot open shared object file"}, flex={"status": "skipped", "reason": "torch does not import"})))
    assert results["versions"].status == "fail" and "libcudnn" in results["versions"].message
    assert results["flex-attention"].status == "warn"


def test_flex_attention_verdicts():
    workstation = {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "capability": [12, 0], "total_memory": 96 * GIB, "smem_per_block_optin": 101376}
    error = "out of shared memory: No valid triton configs. OutOfResources: out of resource: shared memory, Required: 106496, Hardware limit: 101376."
    small = {"status": "ok", "kernel_options": {"fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32}}
    tiles = run_checks(FakeHost(facts(torch={"devices": [workstation] * 2}, flex={"status": "failed", "error": error, "smem_required": 106496, "smem_limit": 101376, "small_tiles": small})))
    status, message, fix = verdict(tiles, "flex-attention")
    assert status == "warn" and "needs 104 KiB shared memory per block, the GPU has 99 KiB" in message and "sm_120" in message
    assert "fwd_BLOCK_M=32" in fix
    broken = run_checks(FakeHost(facts(torch={"devices": [workstation] * 2}, flex={"status": "failed", "error": error, "smem_required": 106496, "smem_limit": 101376, "small_tiles": {"status": "failed", "error": "still"}})))
    assert broken["flex-attention"].status == "fail" and 'pipeline.stages.train.attn_impl = "sdpa"' in broken["flex-attention"].fix
    # the train stage's auto attention resolves to flex on this GPU: refused too; the small tiles would do
    assert broken["train-settings"].status == "fail" and "simple_flex_attention (auto)" in broken["train-settings"].message
    assert tiles["train-settings"].status == "ok"
    cpu = run_checks(FakeHost(facts(flex={"status": "failed", "device": "cpu", "error": "NotImplementedError: FlexAttention does not support backward on CPU."})))
    assert cpu["flex-attention"].status == "warn" and "backward on CPU" in cpu["flex-attention"].message


def test_shared_memory_numbers_parse_the_triton_message():
    spec = importlib.util.spec_from_file_location("ml_probe", Path(__file__).resolve().parents[1] / "harness/host_helpers/ml_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    message = "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 106496, Hardware limit: 101376. Reducing block sizes or `num_stages` may help."
    assert probe.shared_memory_numbers("No valid triton configs. " + message) == (106496, 101376)
    assert probe.shared_memory_numbers("RuntimeError: something else") is None


def test_verifier_config_dtype_and_target_layers():
    nested = run_checks(FakeHost(facts(verifier={"model_type": "llava", "nested_text_config": True, "text_model_type": "llama"})))
    assert nested["verifier"].status == "ok" and "nested text_config (model_type llava -> llama)" in nested["verifier"].message
    no_layers = run_checks(FakeHost(facts(verifier={"num_hidden_layers": None})))
    assert no_layers["verifier"].status == "fail" and no_layers["target-layers"].status == "warn"
    absent = run_checks(FakeHost(facts(verifier={"found": False, "error": "no config.json at models/llama"})))
    assert absent["verifier"].status == "warn" and absent["verifier-dtype"].status == "warn"
    assert run_checks(FakeHost(facts(verifier={"dtype": "float32"})))["verifier-dtype"].status == "warn"
    assert run_checks(FakeHost(facts(verifier={"dtype": "float16"})))["verifier-dtype"].status == "warn"
    assert run_checks(FakeHost(facts(verifier={"dtype": None})))["verifier-dtype"].status == "warn"
    # speculators' default [2, N//2, N-3]: distinct and in range from N = 7 on (N = 3 happens to work)
    for n, status in [(6, "fail"), (5, "fail"), (4, "fail"), (7, "ok"), (3, "ok")]:
        r = run_checks(FakeHost(facts(verifier={"num_hidden_layers": n})))["target-layers"]
        assert r.status == status, (n, r)
    six = run_checks(FakeHost(facts(verifier={"num_hidden_layers": 6})))["target-layers"]
    assert "[2, 3, 3]" in six.message and six.fix.startswith("the default needs N >= 7 layers")
    explicit = project(pipeline="target_layer_ids = [2, 16, 40]")
    r = run_checks(FakeHost(HEALTHY), explicit)["target-layers"]
    assert r.status == "fail" and "pipeline.target_layer_ids = [2, 16, 40]" in r.message
    last = run_checks(FakeHost(HEALTHY), project(pipeline="target_layer_ids = [2, 16, 32]"))["target-layers"]
    assert last.status == "warn"


def test_vllm_network_verdicts():
    """A namespace of its own: ok anywhere; refused inside a container (docker's seccomp, as HEALTHY
    says): ok, the container's network is its own; refused on the host runtime: a warning with the fix."""
    refused = HEALTHY["private_network"]
    in_container = run_checks(FakeHost(HEALTHY))["vllm-network"]
    assert in_container.status == "ok" and in_container.message.startswith("vLLM's workers listen in the container's own network")
    allowed = run_checks(FakeHost(facts(private_network={"allowed": True, "reason": ""})), runtime="host")["vllm-network"]
    assert allowed.status == "ok" and allowed.message.startswith("vLLM's workers get a network namespace of their own")
    on_host = run_checks(FakeHost(HEALTHY), runtime="host")["vllm-network"]
    assert on_host.status == "warn" and refused["reason"] in on_host.message and "box's loopback" in on_host.message
    assert on_host.fix.startswith('runtime = "docker", or allow unprivileged user namespaces')
    unknown = run_checks(FakeHost(facts(private_network=None)))["vllm-network"]
    assert unknown.status == "warn" and "no remote_scripts/common/private_network.py" in unknown.message


def test_train_settings_known_bad_combinations():
    def train_settings(probe, train=""):
        return run_checks(FakeHost(probe), project(train=train))["train-settings"]

    # GPU, torch 2.14: auto resolves to flex attention and the fused loss
    auto = train_settings(HEALTHY)
    assert (auto.status, auto.message) == ("ok", "attention simple_flex_attention (auto), loss fused (auto) on CUDA")
    # explicit dense attention on a GPU where flex works: trains, with a dense mask
    for dense in ("sdpa", "eager"):
        r = train_settings(HEALTHY, f'attn_impl = "{dense}"')
        assert r.status == "warn" and "dense attention mask" in r.message and 'attn_impl = "auto"' in r.fix
    # ... but it is the right choice where flex does not compile
    no_flex = facts(flex={"status": "failed", "error": "no", "small_tiles": {"status": "failed"}})
    assert train_settings(no_flex, 'attn_impl = "sdpa"').status == "ok"
    # torch 2.11: auto picks the eager loss (fine); an explicit fused loss is refused
    torch_211 = facts(versions={"torch": "2.11.0+cu128"}, torch={"version": "2.11.0+cu128"})
    r = train_settings(torch_211)
    assert (r.status, r.message) == ("ok", "attention simple_flex_attention (auto), loss eager (auto) on CUDA")
    fused = train_settings(torch_211, 'loss_implementation = "fused"')
    assert (fused.status, fused.fix) == ("fail", 'use the eager loss: pipeline.stages.train.loss_implementation = "eager"')
    assert train_settings(torch_211, 'loss_implementation = "eager"').status == "ok"
    # CPU: auto resolves to sdpa + eager; explicit flex attention or fused loss cannot train there
    cpu = facts(torch={"cuda_available": False, "devices": []})
    r = train_settings(cpu)
    assert (r.status, r.message) == ("ok", "attention sdpa (auto), loss eager (auto) on CPU")
    flex_cpu = train_settings(cpu, 'attn_impl = "simple_flex_attention"')
    assert flex_cpu.status == "fail" and "no backward on CPU" in flex_cpu.message and 'pipeline.stages.train.attn_impl = "sdpa"' in flex_cpu.fix
    fused_cpu = train_settings(cpu, 'loss_implementation = "fused"')
    assert fused_cpu.status == "fail" and "no Triton on CPU" in fused_cpu.message
    # values train_draft.py would refuse (including the names speculators uses, not the script)
    assert train_settings(HEALTHY, 'attn_impl = "flash"').status == "fail"
    assert train_settings(HEALTHY, 'attn_impl = "flex_attention"').status == "fail"
    assert train_settings(HEALTHY, 'loss_implementation = "triton"').status == "fail"


def test_train_settings_mirror_train_draft(monkeypatch):
    """The doctor's keys, choices and resolution of "auto" are train_draft.py's own (the laptop
    side never imports remote_scripts/, so the mirror is checked here against the script)."""
    import argparse

    from harness.doctor import ml_checks
    from harness.pipeline import to_flags

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "remote_scripts"))
    import train_draft
    from common import draft_attention

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", lambda self, argv=None: self)
    parser = train_draft.parse_args([])  # the parser itself, with its real flags and choices
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    for key, choices in ((ml_checks.ATTN_KEY, ml_checks.ATTN_CHOICES), (ml_checks.LOSS_KEY, ml_checks.LOSS_CHOICES)):
        flag = to_flags({key: "x"})[0]  # how the pipeline passes [pipeline.stages.train] key
        assert flag in by_flag, f"train_draft.py has no {flag}"
        assert tuple(by_flag[flag].choices) == choices and by_flag[flag].default == "auto"
    for device in ("cpu", "cuda"):
        assert ml_checks.resolve_attention("auto", device) == draft_attention.default_attn_impl(device)
        for version in ("2.11.0+cu128", "2.11.1", "2.10.0", "2.14.0+cu129", "2.15.0.dev20260101"):
            assert ml_checks.resolve_loss("auto", device, version) == train_draft.choose_loss_implementation(device, version), (device, version)
        for explicit in ("sdpa", "eager", "simple_flex_attention"):
            assert ml_checks.resolve_attention(explicit, device) == explicit
        assert ml_checks.resolve_loss("fused", device, "2.11.0") == "fused"
def test_version_matching():
    m = compat.matches
    assert m("2.14.0+cu129", "==2.14.0") and m("2.14.0", ">=2.9.0,<=2.14.1") and not m("2.14.2", ">=2.9.0,<=2.14.1")
    assert m("2.11.0+cu128", "==2.11.*") and not m("2.1.0", "==2.11.*")
    assert m("5.20.9", ">=5.16.1,<5.21") and not m("5.21.0", ">=5.16.1,<5.21")
    assert not m("2.15.0.dev20260101", ">=2.15.0") and m("2.15.0.dev20260101", ">2.14.1")
    assert m("2.14", "==2.14.0") and m("0.9.0", "~=0.9.0") and not m("0.10.0", "~=0.9.0")
    with pytest.raises(ValueError):
        m("2.14.0", "=>2.0")


def test_probe_runs_on_this_machine(tmp_path):
    """The real probe script through a HostRuntime: this machine's CPU torch and libraries."""
    from harness.transport.local import LocalTransport

    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs/chat.jsonl").write_text('{"a": 1}\n{"a": 2}\n\n{"a": 3}\n')
    verifier = tmp_path / "models/tiny"
    verifier.mkdir(parents=True)
    (verifier / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "text_config": {"model_type": "qwen2", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "dtype": "bfloat16"}}))
    config = project(pipeline='data = "outputs/chat.jsonl"', train='attn_impl = "sdpa"', verifier="models/tiny")
    host = config.host("gpu")
    import dataclasses

    host = dataclasses.replace(host, runtime="host", python=sys.executable, workdir=str(tmp_path))
    # the project's own private_network.py, sent to the probe
    (tmp_path / "remote_scripts" / "common").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "remote_scripts" / "common" / "private_network.py", tmp_path / "remote_scripts" / "common")
    config = dataclasses.replace(config, path=tmp_path / "harness.toml")
    doctor = MLDoctor(config, host, HostRuntime(host, str(tmp_path)))
    outcome = doctor.probe(LocalTransport())
    assert outcome.facts is not None, outcome.error
    f = outcome.facts
    import importlib.metadata as md

    assert f["versions"]["torch"] == md.version("torch") and f["versions"]["speculators"] == md.version("speculators")
    assert f["verifier"]["nested_text_config"] and (f["verifier"]["num_hidden_layers"], f["verifier"]["head_dim"]) == (8, 16)
    assert f["samples"] == {"count": 3, "source": "lines of the chat data outputs/chat.jsonl"}
    assert f["torch"]["cuda_available"] is False and f["flex"]["status"] == "failed" and "backward on CPU" in f["flex"]["error"]
    results = {r.name: r for r in (check(LocalTransport(), host) for check in doctor.checks())}
    assert results["target-layers"].message == "speculators' default [2, N//2, N-3] = [2, 4, 5] (N = 8)"
    assert results["train-settings"].status == "ok" and results["flex-attention"].status == "warn"
    assert f["private_network"] == {"allowed": True, "reason": ""} and results["vllm-network"].status == "ok"  # this machine allows one


# ---------------------------------------------------------------------------------------------
# End to end: `harness doctor box` over SSH, docker runtime, the test engine


@pytest.mark.ssh
@pytest.mark.docker
def test_doctor_end_to_end_over_ssh_with_docker(tmp_path, ssh_host, docker_base_image):
    from tests.fixtures.docker_engine import container_table
    from tests.fixtures.job_project import toml_value, write_build_context

    write_build_context(tmp_path)
    (tmp_path / "remote_scripts" / "common").mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "remote_scripts" / "common" / "private_network.py", tmp_path / "remote_scripts" / "common")
    container = container_table(docker_base_image, image="harness-doctor-test")
    lines = ["[hosts.box]", f'ssh = "{ssh_host.alias}"', f'workdir = "{tmp_path / "work"}"', 'runtime = "docker"', "[hosts.box.container]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in container.items()]
    config = tmp_path / "harness.toml"
    config.write_text("\n".join(lines) + "\n")

    def doctor() -> tuple[int, dict[str, dict]]:
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "doctor", "box", "--json"], capture_output=True, text=True, timeout=600, env=ssh_host.env())
        return r.returncode, {c["name"]: c for c in json.loads(r.stdout)["checks"]}

    tags = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "harness-doctor-test"], capture_output=True, text=True).stdout.split()
    if tags:  # a previous run's build: start from no image at all
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True, check=True)
    code, checks = doctor()
    assert code == 1 and checks["connect"]["status"] == "ok"
    assert checks["image"]["status"] == "fail" and checks["image"]["fix"] == "harness build box"
    assert checks["stage-gpus"]["status"] == "fail" and checks["stage-gpus"]["fix"] == "harness build box"

    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "build", "box"], capture_output=True, text=True, timeout=600, env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    code, checks = doctor()
    assert checks["image"]["status"] == "ok" and checks["image"]["message"].startswith("harness-doctor-test:")
    # the test image has python3 but no ML stack, and the container gets no GPU
    assert checks["stage-gpus"]["status"] == "warn" and "gpus = \"none\"" in checks["stage-gpus"]["message"]
    assert checks["versions"]["status"] == "fail" and checks["versions"]["message"].startswith("not installed: torch, transformers, speculators")
    assert checks["flex-attention"]["status"] == "warn" and checks["verifier"]["status"] == "warn"
    # docker's default seccomp profile refuses a namespace inside the container, whose network is its own
    assert checks["vllm-network"]["status"] == "ok" and "container's own network" in checks["vllm-network"]["message"], checks["vllm-network"]
    assert "Operation not permitted" in checks["vllm-network"]["message"]
    assert code == 1
    # :latest moved away from the current build: stages would run another image
    subprocess.run(["docker", "rmi", "harness-doctor-test:latest"], capture_output=True, check=True)
    code, checks = doctor()
    assert checks["image"]["status"] == "warn" and checks["image"]["fix"] == "harness build box (re-tags, nothing rebuilds)"
    # a script edit since the build: the image is still the one runs need (they use the synced scripts);
    # before, the row failed "not built" after every script edit
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "build", "box"], capture_output=True, text=True, timeout=600, env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    (tmp_path / "remote_scripts" / "train_draft.py").write_text((tmp_path / "remote_scripts" / "train_draft.py").read_text() + "# edited\n")
    code, checks = doctor()
    assert checks["image"]["status"] == "ok" and "remote_scripts/ changed since, and runs use the synced copy" in checks["image"]["message"], checks["image"]
    # an edit of container/ is a rebuild's to bring in
    (tmp_path / "container" / "requirements.txt").write_text((tmp_path / "container" / "requirements.txt").read_text() + "# edited\n")
    code, checks = doctor()
    assert checks["image"]["status"] == "fail" and checks["image"]["fix"] == "harness build box", checks["image"]
