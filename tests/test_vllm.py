"""The vLLM backends against a REAL vLLM (vllm-cpu 0.32.0 on these machines): extraction through
`harness run`, regeneration greedy and sampled against one shared server, the server's lifecycle,
and what is refused before a server starts.

Every engine start costs about a CPU-minute, so there are three: extraction's, the regenerate
checks' (one server, `regenerate --endpoint`), and one that dies at start. The stand-in server
(tests/fixtures/vllm_stand_in.py) stays in test_extract/test_regenerate for what a real vLLM
cannot be made to do on cue (hang before /health, a client that fails).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.beds import bed_unavailable
from tests.fixtures.job_project import run_artifact
from tests.fixtures.other_user import VLLM_ROUTES, command_lines_holding
from tests.fixtures.pipeline_data import SCRIPTS_DIR, offline_env, read_events, run_script
from tests.fixtures.sshd import free_port

sys.path.insert(0, str(SCRIPTS_DIR))

# What makes a CPU engine small and quick to start beside other work: a 1 GiB KV cache, no thread
# pinning, no torch.compile (--enforce-eager), the engine in the server's process (no second import
# of vLLM), workers forked rather than spawned.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    "OMP_NUM_THREADS": "1",
}
SERVE_FLAGS = ["--max-model-len", "256", "--vllm-arg=--enforce-eager", "--health-timeout", "900", "--stop-grace", "30"]
MAX_NEW = 12
PROMPTS = 16
# bf16 (vLLM) against float32 computed then rounded to bf16 (transformers) on the tiny verifier:
# 0.99996 / 0.9 % measured on 60 rows; the bounds leave room for other rows, not for a wrong layer.
MIN_COSINE = 0.9995
MAX_RELATIVE_ERROR = 0.03


def vllm_env() -> dict[str, str]:
    return offline_env(**VLLM_ENV)


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text` (a path unique to this test)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def _live_members(group: int) -> list[str]:
    """Processes of process group `group` that still run (zombies awaiting their reaper excluded)."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == group and state not in ("Z", "X"):
            members.append(f"{pid} ({stat.split(')')[0].split('(', 1)[1]}, {state})")
    return members


# ---------------------------------------------------------------------------------------------
# Extraction through `harness run`


def _harness(config: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout, env=vllm_env(), cwd=config.parent)


def _compare_states(vllm_dir: Path, transformers_dir: Path, count: int) -> tuple[float, float]:
    """(lowest cosine, highest relative error) over every file and layer; token ids must be equal."""
    import torch
    from safetensors.torch import load_file

    lowest, highest = 1.0, 0.0
    for i in range(count):
        a, b = load_file(str(vllm_dir / f"hs_{i}.safetensors")), load_file(str(transformers_dir / f"hs_{i}.safetensors"))
        assert torch.equal(a["token_ids"], b["token_ids"]), i
        assert a["hidden_states"].dtype == b["hidden_states"].dtype == torch.bfloat16
        assert a["hidden_states"].shape == b["hidden_states"].shape, (i, a["hidden_states"].shape, b["hidden_states"].shape)
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        for layer in range(x.shape[1]):
            u, v = x[:, layer].flatten(), y[:, layer].flatten()
            lowest = min(lowest, torch.nn.functional.cosine_similarity(u, v, dim=0).item())
            highest = max(highest, ((u - v).norm() / v.norm()).item())
    return lowest, highest


@pytest.mark.pipeline
@pytest.mark.vllm
def test_extract_vllm_through_harness_run_equals_the_transformers_backend(vllm_verifier, tmp_path):
    from datasets import load_from_disk

    project = tmp_path / "project"
    shutil.copytree(SCRIPTS_DIR, project / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    workdir = project / "work"
    stage = {"backend": "vllm", "prepared": str(vllm_verifier / "prepared"), "concurrency": 4, "max_model_len": 256,
             "vllm_arg": "--enforce-eager", "health_timeout": 900}
    (project / "harness.toml").write_text(
        f'[hosts.local]\nlocal = true\nworkdir = "{workdir}"\nruntime = "host"\npython = "{sys.executable}"\nenv = {json.dumps(sorted(VLLM_ENV))}\n\n'
        '[sync]\npaths = ["remote_scripts"]\n\n'
        f'[pipeline]\nverifier = "{vllm_verifier / "verifier"}"\n\n'
        "[pipeline.stages.extract]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in stage.items())
    )
    assert _harness(project / "harness.toml", "sync", "local", timeout=120).returncode == 0
    run = _harness(project / "harness.toml", "run", "local", "extract", timeout=1200)
    out = run_artifact(workdir, run.stdout.split()[0], "extract")
    server_log = out / "vllm_server.rank0.log"
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + (server_log.read_text()[-3000:] if server_log.exists() else "")

    # One --kv-transfer-config, naming our CPU connector and where vLLM imports it from.
    command = server_log.read_text().splitlines()[0]
    assert command.count("--kv-transfer-config") == 1 and '"kv_connector": "CpuHiddenStatesConnector"' in command
    assert '"kv_connector_module_path": "vllm_compat"' in command and "--dtype bfloat16" in command
    # On a unix socket (speculators' client reached it through the endpoint shim), its workers'
    # keyless listeners in a network namespace of their own.
    [started] = [e["text"] for e in read_events(next((workdir / "runs").glob("*/extract/events.jsonl"))) if "vllm serve on" in e.get("text", "")]
    assert "vllm serve on unix socket /tmp/harness-vllm-" in started and "(its workers in a network namespace of its own)" in started, started
    # Stopped at the end (SIGTERM to its group), nothing of it left running.
    assert "[harness] vllm serve stopped (exit" in server_log.read_text().splitlines()[-1]
    assert _processes_mentioning(str(workdir)) == []

    rows = len(load_from_disk(str(vllm_verifier / "prepared")))
    assert sorted(p.name for p in out.glob("hs_*.safetensors")) == sorted(f"hs_{i}.safetensors" for i in range(rows))
    reference = tmp_path / "transformers"
    run_script("extract_hidden_states.py", "--verifier", vllm_verifier / "verifier", "--prepared", vllm_verifier / "prepared", "--output", reference)
    cosine, relative = _compare_states(out, reference, rows)
    assert cosine >= MIN_COSINE and relative <= MAX_RELATIVE_ERROR, (cosine, relative)


# ---------------------------------------------------------------------------------------------
# Regeneration: one real server for every check (`regenerate --endpoint`), and its lifecycle


def _prompts(verifier_root: Path, path: Path) -> Path:
    rows = [json.loads(line) for line in (verifier_root / "chat.jsonl").read_text().splitlines()]
    prompts = [{"id": r["id"], "split": "train", "messages": r["messages"][:1]} for r in rows if r["split"] == "train"][:PROMPTS]
    path.write_text("".join(json.dumps(r) + "\n" for r in prompts))
    return path


def _replies(path: Path) -> list[str]:
    return [json.loads(line)["messages"][-1]["content"] for line in path.read_text().splitlines()]


@pytest.mark.pipeline
@pytest.mark.vllm
def test_regenerate_greedy_and_sampled_against_one_real_server(vllm_verifier, tmp_path, other_user):
    from common.vllm_compat import default_vllm_command
    from common.vllm_server import ManagedServer, ServeOptions

    verifier = vllm_verifier / "verifier"
    data = _prompts(vllm_verifier, tmp_path / "prompts.jsonl")
    reference = tmp_path / "transformers.jsonl"
    run_script("regenerate.py", "--verifier", verifier, "--data", data, "--output", reference, "--max-new-tokens", MAX_NEW)
    greedy_reference = _replies(reference)

    # float32: the transformers backend computes in float32 on the CPU; bf16 flips near-ties.
    opts = ServeOptions(model=str(verifier), port=free_port(), max_model_len=256, dtype="float32", vllm_command=default_vllm_command(), extra_args=["--enforce-eager"])
    server = ManagedServer(opts, tmp_path / "server.log", stop_grace=30, env=vllm_env())
    with server:
        server.wait_healthy(900)
        group = server.proc.pid

        def regenerate(name: str, *flags) -> list[str]:
            out = tmp_path / f"{name}.jsonl"
            run_script("regenerate.py", "--backend", "vllm", "--endpoint", opts.base_url, "--verifier", verifier, "--data", data,
                       "--output", out, "--max-new-tokens", MAX_NEW, "--concurrency", 4, *flags)
            return _replies(out)

        assert regenerate("greedy") == greedy_reference
        first, again, other = (regenerate(name, "--temperature", 1.0, "--seed", seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
        assert first == again  # same seed, same replies
        assert first != other and first != greedy_reference  # another seed, and sampling at all
        assert regenerate("nucleus", "--temperature", 1.0, "--top-p", 1e-6, "--seed", 3) == greedy_reference  # top-p keeps only the top token
        # several replies per prompt: the greedy one first, the others sampled (seeded as above: reply r at --seed + r)
        several = regenerate("three", "--replies-per-prompt", 3, "--sample-temperature", 1.0, "--seed", 5)
        assert len(several) == 3 * len(greedy_reference) and several[::3] == greedy_reference
        assert [r for i, r in enumerate(several) if i % 3] != [g for g in greedy_reference for _ in range(2)]

        # Ours alone: another local user gets 401 on every route that serves the model, data or
        # metrics (vllm_compat's key-on-every-route), and the key is on no command line.
        seen = other_user.probe(opts.base_url, VLLM_ROUTES)
        assert set(seen.values()) == {401}, seen
        assert command_lines_holding(server.api_key) == []

    # SIGTERM to the server's process group, then the group is gone: no orphaned engine.
    assert server.exit_code is not None
    deadline = time.monotonic() + 10  # SIGKILLed members may take a moment to go
    while _live_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _live_members(group) == []
    assert "[harness] vllm serve stopped (exit" in (tmp_path / "server.log").read_text().splitlines()[-1]
    assert server.api_key not in (tmp_path / "server.log").read_text()  # nor in its log


def test_the_key_on_every_route_shim_finds_vllm_0_26s_middleware(tmp_path, monkeypatch):
    """vLLM 0.26.0 (the GPU image's) keeps the middleware in entrypoints/serve/utils/server_utils.py,
    not middleware/authenticate.py: the shim patches it there (its __call__ as 0.26.0 has it)."""
    from common.vllm_compat import AUTHENTICATION_MODULES, guard_every_route

    source = tmp_path / "server_utils.py"
    source.write_text(
        'GUARDED_PREFIX = ("/v1", "/v2", "/inference")\n\n\n'
        "class AuthenticationMiddleware:\n"
        "    def __call__(self, scope, receive, send):\n"
        '        url_path = scope["path"]\n'
        "        if url_path.startswith(GUARDED_PREFIX) and not self.verify_token(scope):\n"
        "            return None\n"
        "        return self.app(scope, receive, send)\n")
    spec = importlib.util.spec_from_file_location(AUTHENTICATION_MODULES[1], source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, AUTHENTICATION_MODULES[0], None)  # 0.26.0 has no such module
    monkeypatch.setitem(sys.modules, AUTHENTICATION_MODULES[1], module)
    guard_every_route()
    assert module.GUARDED_PREFIX == ("/",)


def test_vllm_wants_its_key_on_every_route_when_started_through_vllm_compat():
    """vllm_compat's key-on-every-route shim on the installed vLLM's own middleware (no engine):
    without the key /metrics, /tokenize, /health ... are 401 too, not only /v1."""
    import asyncio

    from vllm.entrypoints.serve.middleware import authenticate

    from common.vllm_compat import guard_every_route

    before = authenticate.GUARDED_PREFIX
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b""}

    def status(path: str, headers: list) -> int | None:
        sent = []

        async def send(message):
            sent.append(message)

        asyncio.run(authenticate.AuthenticationMiddleware(app, tokens=["the-key"])({"type": "http", "method": "GET", "path": path, "headers": headers}, receive, send))
        return sent[0]["status"] if sent else None

    try:
        assert status("/metrics", []) is None  # vLLM's own prefixes leave it open
        reached.clear()
        guard_every_route()
        assert {p: status(p, []) for p in ("/metrics", "/tokenize", "/invocations", "/health", "/v1/models")} == dict.fromkeys(
            ("/metrics", "/tokenize", "/invocations", "/health", "/v1/models"), 401)
        assert reached == []
        assert status("/metrics", [(b"authorization", b"Bearer the-key")]) is None and reached == ["/metrics"]
    finally:
        authenticate.GUARDED_PREFIX = before


@pytest.mark.pipeline
@pytest.mark.vllm
def test_a_real_server_that_dies_at_start_fails_the_stage_in_one_line(vllm_verifier, tmp_path):
    """vLLM itself refuses the checkpoint (an architecture it does not know) and exits."""
    verifier = tmp_path / "verifier"
    shutil.copytree(vllm_verifier / "verifier", verifier)
    config = json.loads((verifier / "config.json").read_text())
    (verifier / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    events = tmp_path / "events.jsonl"
    proc = run_script("regenerate.py", "--backend", "vllm", "--verifier", verifier, "--data", _prompts(vllm_verifier, tmp_path / "p.jsonl"),
                      "--output", tmp_path / "out.jsonl", "--max-model-len", 256, "--vllm-arg=--enforce-eager",
                      "--health-timeout", 900, "--events", events, check=False, env=vllm_env(), timeout=900)
    assert proc.returncode == 1
    error = read_events(events)[-1]["error"]
    assert error.startswith("ServerFailed: vllm serve exited with status") and "\n" not in error
    assert "NoSuchModelForCausalLM" in error  # the log's tail says why
    assert _processes_mentioning(str(verifier)) == []


# ---------------------------------------------------------------------------------------------
# Refused before a server starts (no engine)


def _head16_verifier(path: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4).save_pretrained(path)
    return path


@pytest.mark.pipeline
def test_a_verifier_vllm_cannot_serve_is_refused_before_the_server_starts(vllm_verifier, tmp_path):
    events, out = tmp_path / "events.jsonl", tmp_path / "hs"
    proc = run_script("extract_hidden_states.py", "--backend", "vllm", "--verifier", _head16_verifier(tmp_path / "v"), "--prepared", vllm_verifier / "prepared",
                      "--output", out, "--events", events, check=False)
    assert proc.returncode == 1
    error = read_events(events)[-1]["error"]
    assert error.startswith("ValueError: vLLM's CPU attention cannot serve this verifier: attention head size 16") and "\n" not in error
    assert not (out / "vllm_server.rank0.log").exists()


@pytest.mark.pipeline
def test_extraction_in_another_dtype_is_refused_in_one_line(vllm_verifier, tmp_path):
    events, out = tmp_path / "events.jsonl", tmp_path / "hs"
    proc = run_script("extract_hidden_states.py", "--backend", "vllm", "--verifier", vllm_verifier / "verifier", "--prepared", vllm_verifier / "prepared",
                      "--output", out, "--vllm-arg=--dtype=float32", "--events", events, check=False)
    assert proc.returncode == 1
    error = read_events(events)[-1]["error"]
    assert error.startswith("ValueError: extract --backend vllm writes bf16 files") and "--dtype float32" in error
    assert not (out / "vllm_server.rank0.log").exists()


def test_unservable_reason_reads_vllm_s_cpu_head_sizes():
    from transformers import LlamaConfig

    from common.vllm_compat import cpu_attention_head_sizes, unservable_reason

    if importlib.util.find_spec("vllm") is None:
        bed_unavailable("vllm", "vllm is not installed in this environment")
    sizes = cpu_attention_head_sizes()
    assert 32 in sizes and 16 not in sizes
    head16 = LlamaConfig(hidden_size=64, num_attention_heads=4)
    assert "head size 16" in unservable_reason(head16, "vllm-cpu")
    assert unservable_reason(LlamaConfig(hidden_size=64, num_attention_heads=2), "vllm-cpu") is None
    assert unservable_reason(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=32), "vllm-cpu") is None  # an explicit head_dim wins
    assert unservable_reason(head16, "vllm") is None  # GPU attention backends are vLLM's to judge


def test_unservable_reason_reads_vllm_s_mla_latent_sizes():
    """An MLA verifier (DeepSeek-V3, Kimi-K2.5) serves only at the latent sizes vLLM's MLA takes:
    the toy Kimi-K2.5 is built at the real model's 576."""
    from types import SimpleNamespace

    from common.tiny_kimi_k25 import SERVED_MLA, KimiSpec
    from common.vllm_compat import mla_latent_sizes, unservable_reason

    if importlib.util.find_spec("vllm") is None:
        bed_unavailable("vllm", "vllm is not installed in this environment")
    assert SERVED_MLA["kv_lora_rank"] + KimiSpec().rope_head_dim in mla_latent_sizes("vllm-cpu")

    def mla(rank: int, rope: int):
        return SimpleNamespace(text_config=SimpleNamespace(kv_lora_rank=rank, qk_rope_head_dim=rope, hidden_size=128, num_attention_heads=4))

    assert unservable_reason(mla(512, 64), "vllm-cpu") is None
    reason = unservable_reason(mla(32, 16), "vllm-cpu")
    assert "latent cache (kv_lora_rank + qk_rope_head_dim) is 48" in reason and "576" in reason
    assert "is 48" in unservable_reason(mla(32, 16), "vllm")  # every build's MLA metadata refuses it


# ---------------------------------------------------------------------------------------------
# The connector: composed into one --kv-transfer-config; the CPU one checks what it extends


def test_the_connector_is_one_kv_transfer_config():
    from common.vllm_compat import resolve_hidden_states_connector
    from common.vllm_server import ServeOptions, serve_argv

    assert resolve_hidden_states_connector("auto", cuda_available=False) == "cpu"
    assert resolve_hidden_states_connector("auto", cuda_available=True) == "vllm"
    assert resolve_hidden_states_connector("vllm", cuda_available=False) == "vllm"
    for connector, name, module in (("cpu", "CpuHiddenStatesConnector", "vllm_compat"), ("vllm", "ExampleHiddenStatesConnector", None)):
        argv = serve_argv(ServeOptions(model="m", layer_ids=[2], num_layers=4, staging_dir="/s", hidden_states_connector=connector, extra_args=["--enforce-eager"]))
        assert argv.count("--kv-transfer-config") == 1
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == name and config.get("kv_connector_module_path") == module
        assert config["kv_role"] == "kv_producer" and config["kv_connector_extra_config"] == {"shared_storage_path": "/s"}
    with pytest.raises(ValueError):
        serve_argv(ServeOptions(model="m", layer_ids=[2], num_layers=4, staging_dir="/s", hidden_states_connector="auto"))


def test_the_cpu_connector_checks_the_class_it_extends():
    if importlib.util.find_spec("vllm") is None:
        bed_unavailable("vllm", "vllm is not installed in this environment")
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import ExampleHiddenStatesConnector

    import common.vllm_compat as compat

    assert compat.check_cpu_connector() is ExampleHiddenStatesConnector
    assert issubclass(compat.CpuHiddenStatesConnector, ExampleHiddenStatesConnector)

    class WritesWithoutWaiting(ExampleHiddenStatesConnector):  # vLLM changed the writer it reuses
        @staticmethod
        def _write_tensors(tensors, event, filename, lock_fd):
            pass

    class LostAMethod(ExampleHiddenStatesConnector):
        _on_write_done = None

    for changed in (WritesWithoutWaiting, LostAMethod):
        with pytest.raises(compat.ShimOutdated, match="cpu-hidden-states-connector"):
            compat.check_cpu_connector(changed)
