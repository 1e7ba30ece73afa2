"""extract_hidden_states.py: speculators' hs_<i>.safetensors from the verifier (transformers backend),
resume, sharding, nested verifiers; the vllm backend's command line and server lifecycle."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))
import extract_hidden_states as extract  # noqa: E402
from common.hidden_state_files import check_file, hs_path  # noqa: E402
from common.sharding import plan_batches, shard_range  # noqa: E402
from common.vllm_server import LOOPBACK_ENV  # noqa: E402


def _extract(*args) -> int:
    return extract.main([str(a) for a in args])


def _load_rows(prepared):
    from datasets import load_from_disk

    ds = load_from_disk(str(prepared))
    ds.set_format("torch")
    return ds


def _reference(model, input_ids, layer_ids):
    """[T, k+1, H] computed without hooks: HF's output_hidden_states[i] is the input of layer i, and
    with the final norm replaced by Identity, output_hidden_states[-1] is the pre-norm last layer."""
    import torch

    from common.verifier import locate_decoder

    parts = locate_decoder(model)
    norm, parts.text_model.norm = parts.text_model.norm, torch.nn.Identity()
    try:
        with torch.no_grad():
            hs = model(input_ids=input_ids[None], output_hidden_states=True).hidden_states
    finally:
        parts.text_model.norm = norm
    n = parts.num_layers
    return torch.stack([hs[i][0] for i in layer_ids] + [hs[n][0]], dim=1)


def _assert_bf16_close(saved, reference):
    import torch

    scale = float(reference.abs().max())
    torch.testing.assert_close(saved.float(), reference.float(), rtol=1.6e-2, atol=1.6e-2 * scale)


def test_files_equal_an_independent_computation(tiny_verifier, prepared_data, hidden_states):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_verifier.verifier).eval()
    meta = json.loads((hidden_states / "extract_meta.json").read_text())
    n = model.config.num_hidden_layers
    assert meta["target_layer_ids"] == [2, n // 2, n - 3]
    rows = _load_rows(prepared_data)
    lengths = set()
    for i in (0, 1, 7, len(rows) // 2, len(rows) - 1):
        saved = load_file(str(hidden_states / f"hs_{i}.safetensors"))
        ids = rows[i]["input_ids"]
        assert saved["hidden_states"].dtype == torch.bfloat16 and saved["token_ids"].dtype == torch.int64
        assert torch.equal(saved["token_ids"], ids)
        assert saved["hidden_states"].shape == (len(ids), 4, model.config.hidden_size)
        _assert_bf16_close(saved["hidden_states"], _reference(model, ids, meta["target_layer_ids"]))
        # The last slot is NOT HF's output_hidden_states[-1] (that one is after the final norm).
        with torch.no_grad():
            post_norm = model(input_ids=ids[None], output_hidden_states=True).hidden_states[-1][0]
        assert not torch.allclose(saved["hidden_states"][:, -1].float(), post_norm, atol=0.1)
        lengths.add(len(ids))
    assert len(lengths) > 1  # rows of different lengths: padding in a batch did not leak


def test_speculators_dataset_reads_the_files(prepared_data, hidden_states):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    dataset = ArrowDataset(max_len=256, datapath=str(prepared_data), transfer=FileTransfer(hidden_states), on_missing="raise")
    sample = dataset[3]
    t = sample["input_ids"].shape[0]
    hidden = json.loads((hidden_states / "extract_meta.json").read_text())["hidden_size"]
    assert sample["hidden_states"].shape == (t, 3 * hidden)
    assert sample["verifier_last_hidden_states"].shape == (t, hidden)
    assert sample["loss_mask"].shape == (t,)


def test_custom_layers_and_the_final_layer_id(tiny_verifier, prepared_data, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_verifier.verifier).eval()
    n = model.config.num_hidden_layers
    out = tmp_path / "hs"
    assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", out, "--layers", 1, 3, n, "--batch-size", 5) == 0
    saved = load_file(str(out / "hs_2.safetensors"))["hidden_states"]
    reference = _reference(model, _load_rows(prepared_data)[2]["input_ids"], [1, 3, n])
    _assert_bf16_close(saved, reference)
    assert (saved[:, 2] == saved[:, 3]).all()  # layer id N is the pre-norm output of the last layer
    assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", tmp_path / "bad", "--layers", 1, n + 1) == 1


def test_resume_regenerates_bad_files_and_keeps_valid_ones(tiny_verifier, prepared_data, hidden_states, tmp_path):
    out = tmp_path / "hs"
    shutil.copytree(hidden_states, out)
    files = sorted(out.glob("hs_*.safetensors"))
    for f in files:
        os.utime(f, (1_000_000_000, 1_000_000_000))
    truncated, missing, stale = out / "hs_3.safetensors", out / "hs_5.safetensors", out / "hs_7.safetensors"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    os.utime(truncated, (1_000_000_000, 1_000_000_000))
    missing.unlink()
    shutil.copy(out / "hs_8.safetensors", stale)  # a readable file for another row: token_ids differ
    os.utime(stale, (1_000_000_000, 1_000_000_000))

    events = tmp_path / "events.jsonl"
    assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", out, "--events", events) == 0
    finished = read_events(events)[-1]
    assert (finished["computed"], finished["regenerated"], finished["skipped_valid"]) == (3, 2, len(files) - 3)
    rows = _load_rows(prepared_data)
    for f in files:
        index = int(f.stem.split("_")[1])
        rewritten = f in (truncated, missing, stale)
        assert (f.stat().st_mtime > 1_000_000_000) == rewritten, f.name
        assert check_file(f, rows[index]["input_ids"].tolist(), 4, finished["hidden"]) is None
    assert not list(out.glob("*.tmp-*"))


def test_shard_ranges_partition_every_sample():
    for n in range(0, 23):
        for world in range(1, 6):
            covered = [i for r in range(world) for i in shard_range(n, r, world)]
            assert covered == list(range(n))
            sizes = [len(shard_range(n, r, world)) for r in range(world)]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        shard_range(10, 3, 3)


def test_shards_write_each_sample_exactly_once(tiny_verifier, prepared_data, tmp_path, monkeypatch):
    out = tmp_path / "hs"
    n = len(_load_rows(prepared_data))
    seen: set[int] = set()
    for rank in range(3):
        if rank == 1:  # torchrun's environment instead of flags
            monkeypatch.setenv("RANK", "1")
            monkeypatch.setenv("WORLD_SIZE", "3")
            flags = []
        else:
            monkeypatch.delenv("RANK", raising=False)
            monkeypatch.delenv("WORLD_SIZE", raising=False)
            flags = ["--rank", rank, "--world-size", 3]
        assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", out, *flags) == 0
        written = {int(p.stem.split("_")[1]) for p in out.glob("hs_*.safetensors")}
        mine = set(shard_range(n, rank, 3))
        assert written == seen | mine and not (seen & mine)
        seen = written
    assert seen == set(range(n))
    assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", out, "--verify-only") == 0


def test_verify_only_reports_the_gaps(tiny_verifier, prepared_data, hidden_states, tmp_path):
    out = tmp_path / "hs"
    shutil.copytree(hidden_states, out)
    (out / "hs_4.safetensors").unlink()
    (out / "hs_9.safetensors").write_bytes(b"\x00" * 10)
    events = tmp_path / "events.jsonl"
    assert _extract("--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--output", out, "--verify-only", "--events", events) == 1
    error = read_events(events)[-1]["error"]
    assert "2 sample(s) without a valid file" in error and "hs_4 (missing)" in error and "hs_9 (unreadable" in error
    assert not (out / "hs_4.safetensors").exists()


@pytest.fixture(scope="module")
def nested_verifier(tiny_verifier, tmp_path_factory) -> Path:
    """A tiny Qwen2-VL: the text decoder lives under model.language_model, the layer count under
    config.text_config (no top-level num_hidden_layers), as in Kimi-K2.5 / Qwen-VL verifiers."""
    import torch
    from transformers import AutoConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vocab = AutoConfig.from_pretrained(tiny_verifier.verifier).vocab_size
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}, bos_token_id=None, eos_token_id=None),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2),
        vocab_size=vocab,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config)
    path = tmp_path_factory.mktemp("nested") / "qwen2vl"
    model.save_pretrained(path)
    return path



def test_check_extract_command_reports_ok_then_the_gap_with_exit_1(prepared_data, hidden_states, tmp_path):
    """`harness check-extract HOST` (the CLI over harness.extraction_check, which the multinode
    test drives across hosts): a local host holding every sample, then one file missing."""
    import subprocess

    workdir = tmp_path / "work"
    store = workdir / "outputs" / "artifacts"
    (store / "prepare").mkdir(parents=True)
    (workdir / "remote_scripts").symlink_to(SCRIPTS_DIR)
    keys = {"prepare": "1" * 20, "extract": "2" * 20}
    (store / "prepare" / keys["prepare"]).symlink_to(prepared_data)
    extracted = store / "extract" / keys["extract"]
    shutil.copytree(hidden_states, extracted)
    run_id = "20260101-000000-abcdef"  # a run that made both, as its record names them
    (workdir / "runs" / run_id).mkdir(parents=True)
    (workdir / "runs" / run_id / "run.json").write_text(json.dumps({"run_id": run_id, "store": "outputs/artifacts", "recipes": {"extract": {"reads": {"prepared": "prepare"}}},
                                                                     "artifacts": {s: {"key": k, "role": "made"} for s, k in keys.items()}}))
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.box]\nlocal = true\nworkdir = "{workdir}"\npython = "{sys.executable}"\n')

    def check(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "check-extract", "box", *flags],
                              capture_output=True, text=True, timeout=300)

    n = len(list(hidden_states.glob("hs_*.safetensors")))
    r = check("--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["ok"], report["num_samples"], report["valid_per_host"], report["gaps"]) == (True, n, {"box": n}, "")
    (extracted / "hs_1.safetensors").unlink()
    r = check()
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{n} samples, box: {n - 1} valid"
    assert "GAPS: 1 sample(s) have no valid file on any host: 1" in lines and lines[-1] == "NOT OK"

def test_nested_text_config_verifier(nested_verifier, prepared_data, tmp_path):
    import torch
    from safetensors.torch import load_file

    from common.verifier import load_verifier, locate_decoder, num_hidden_layers

    model = load_verifier(str(nested_verifier))
    assert not hasattr(model.config, "num_hidden_layers")  # only text_config knows the depth
    assert num_hidden_layers(model.config) == 7
    assert locate_decoder(model).path == "model.language_model"
    out = tmp_path / "hs"
    assert _extract("--verifier", nested_verifier, "--prepared", prepared_data, "--output", out, "--batch-size", 4) == 0
    assert json.loads((out / "extract_meta.json").read_text())["target_layer_ids"] == [2, 3, 4]
    rows = _load_rows(prepared_data)
    for i in (0, 11):
        saved = load_file(str(out / f"hs_{i}.safetensors"))
        assert torch.equal(saved["token_ids"], rows[i]["input_ids"])
        reference = _reference(model, rows[i]["input_ids"], [2, 3, 4])
        _assert_bf16_close(saved["hidden_states"], reference)


# ---------------------------------------------------------------------------------------------
# vllm backend: the composed command lines, and the server lifecycle around a stand-in server
# (tests/fixtures/vllm_stand_in.py; a real vLLM cannot be installed on these machines).

STAND_IN = Path(__file__).resolve().parent / "fixtures" / "vllm_stand_in.py"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _vllm_args(tiny_verifier, prepared, out, mode, record, *extra):
    return [
        "--backend", "vllm", "--verifier", tiny_verifier.verifier, "--prepared", prepared, "--output", out,
        "--vllm-command", f"{sys.executable} {STAND_IN} --mode {mode} --record {record}", "--hidden-states-connector", "vllm",
        "--concurrency", 4, "--events", out.parent / "events.jsonl", *extra,
    ]


def test_vllm_serve_command_line():
    from common.vllm_server import ServeOptions, offline_data_argv, serve_argv

    opts = ServeOptions(model="/models/kimi", layer_ids=[2, 30, 58], num_layers=61, staging_dir="/data/staging", port=8100, tensor_parallel_size=8, max_model_len=4096, vllm_command="/opt/venv/bin/vllm", extra_args=["--trust-remote-code"])
    argv = serve_argv(opts)
    assert argv[:3] == ["/opt/venv/bin/vllm", "serve", "/models/kimi"]
    value = lambda flag: argv[argv.index(flag) + 1]  # noqa: E731
    assert json.loads(value("--speculative-config")) == {"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58, 61]}}}
    assert json.loads(value("--kv-transfer-config")) == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": "/data/staging"}}
    assert (value("--port"), value("--tensor-parallel-size"), value("--max-model-len")) == ("8100", "8", "4096")
    assert argv[-1] == "--trust-remote-code"

    # The client command is accepted by the installed speculators CLI (parsed, not run).
    import typer.main
    from speculators.cli import app

    client = offline_data_argv(["speculators", "generate-offline-data"], opts, "/data/prepared", "/data/hs", rank=1, world_size=4, concurrency=16)
    group = typer.main.get_command(app)
    command = group.get_command(group.make_context("speculators", ["generate-offline-data"]), "generate-offline-data")
    params = command.make_context("generate-offline-data", client[2:]).params
    assert params["endpoint"] == "http://127.0.0.1:8100/v1" and params["model"] == "/models/kimi"
    assert (params["preprocessed_data"], params["output"], params["rank"], params["world_size"], params["concurrency"]) == ("/data/prepared", "/data/hs", 1, 4, 16)
    assert params["validate_outputs"] is True


def test_vllm_backend_runs_speculators_offline_datagen_against_a_server(tiny_verifier, prepared_data, hidden_states, tmp_path):
    """The real `speculators generate-offline-data` against the stand-in, which parses our flags
    as vllm would; the files equal the transformers backend's."""
    import torch
    from safetensors.torch import load_file

    out, record = tmp_path / "hs", tmp_path / "server.json"
    proc = run_script("extract_hidden_states.py", *_vllm_args(tiny_verifier, prepared_data, out, "serve", record), check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finished = read_events(tmp_path / "events.jsonl")[-1]
    assert finished["status"] == "ok" and finished["layers"] == [2, 4, 5]
    server = json.loads(record.read_text())
    assert not _alive(server["pid"])  # stopped after the run
    assert server["network"] == LOOPBACK_ENV  # its workers' listeners: on the loopback of a namespace of its own
    assert "listening on" in (out / "vllm_server.rank0.log").read_text()  # log kept
    assert not list((out / ".staging" / "rank0").iterdir())  # every file moved into place
    for i in (0, 5, 17):
        ours, reference = load_file(str(out / f"hs_{i}.safetensors")), load_file(str(hidden_states / f"hs_{i}.safetensors"))
        assert torch.equal(ours["token_ids"], reference["token_ids"])
        _assert_bf16_close(ours["hidden_states"], reference["hidden_states"].float())


class _Squatter:
    """An HTTP server on 127.0.0.1:PORT that answers 200 to everything (a stand-in for a stranger's
    process that grabbed our port) and keeps the Authorization headers it was sent."""

    def __init__(self, port: int):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.authorizations = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"object": "list", "data": [{"id": "anything"}]}')

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_squatter_on_the_port_before_or_while_the_server_loads_is_never_taken_for_it(tiny_verifier, tmp_path):
    """A server on a TCP port (serve_draft.py --port, run by hand: the stages' servers are on
    private sockets) counts as ready only once it proves it is the process we started: a
    stranger's HTTP server on the port (there before the server starts, or taking it while the
    server loads: the stand-in's hang mode never binds) fails in one line, and is never sent the
    server's key."""
    import time

    from common.vllm_server import ManagedServer, ServeOptions, ServerFailed

    port = _free_port()
    for mode in ("serve", "hang"):
        record = tmp_path / f"{mode}.json"
        opts = ServeOptions(model=str(tiny_verifier.verifier), port=port, vllm_command=f"{sys.executable} {STAND_IN} --mode {mode} --record {record}")
        squatter = _Squatter(port) if mode == "serve" else None  # there before the server starts
        try:
            with ManagedServer(opts, tmp_path / f"{mode}.log", stop_grace=1) as server:
                deadline = time.monotonic() + 120
                while squatter is None and not (record.exists() and record.read_text()):  # the server started (and loads: never listens)
                    assert server.alive() and time.monotonic() < deadline, "the server ended early"
                    time.sleep(0.1)
                squatter = squatter or _Squatter(port)
                with pytest.raises(ServerFailed, match=f"port {port} is held by a process this stage did not start"):
                    server.wait_healthy(120)
        finally:
            if squatter is not None:
                squatter.close()
        assert squatter.authorizations == []
        assert not _alive(server.proc.pid)
    # (the hang mode's record is there: its loop waited for it) in the stage's network too, off every other interface
    assert json.loads((tmp_path / "hang.json").read_text())["network"] == LOOPBACK_ENV


def test_a_server_that_answers_without_its_key_is_refused_and_stopped(tiny_verifier, tmp_path):
    """A --vllm-command that does not honour VLLM_API_KEY (here the stand-in started without it in
    its environment) answers anyone: never taken for ready, one line, and stopped."""
    from common.vllm_server import ManagedServer, ServeOptions, ServerFailed

    opts = ServeOptions(model=str(tiny_verifier.verifier), port=_free_port(), vllm_command=f"env -u VLLM_API_KEY {sys.executable} {STAND_IN} --mode health-only")
    with ManagedServer(opts, tmp_path / "keyless.log", stop_grace=1) as server:
        with pytest.raises(ServerFailed, match="answers /v1/models at .* without its API key"):
            server.wait_healthy(120)
    assert not _alive(server.proc.pid)


def test_vllms_ipc_sockets_go_in_a_private_directory_removed_with_the_server(tiny_verifier, tmp_path):
    """vLLM makes its ZMQ sockets in VLLM_RPC_BASE_PATH (default /tmp, where they stayed after each
    server): a 0700 directory of the server's own, gone once it stops (on a unix socket: the
    socket's directory)."""
    import time

    from common.vllm_server import ManagedServer, ServeOptions

    record = tmp_path / "record.json"
    opts = ServeOptions(model=str(tiny_verifier.verifier), port=_free_port(), vllm_command=f"{sys.executable} {STAND_IN} --mode health-only --record {record}")
    with ManagedServer(opts, tmp_path / "server.log", stop_grace=1) as server:
        server.wait_healthy(120)
        deadline = time.monotonic() + 30
        while not (record.exists() and record.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        rpc_dir = Path(json.loads(record.read_text())["rpc_dir"])
        assert rpc_dir.parent == Path("/tmp") and rpc_dir.stat().st_mode & 0o777 == 0o700
    assert not rpc_dir.exists()


def test_vllm_server_that_dies_fails_fast_with_its_log(tiny_verifier, prepared_data, tmp_path):
    out, record = tmp_path / "hs", tmp_path / "server.json"
    import time

    started = time.monotonic()
    proc = run_script("extract_hidden_states.py", *_vllm_args(tiny_verifier, prepared_data, out, "die", record, "--health-timeout", 300), check=False)
    assert proc.returncode == 1 and time.monotonic() - started < 60
    error = read_events(tmp_path / "events.jsonl")[-1]["error"]
    assert "exited with status 3 before becoming healthy" in error and "CUDA out of memory (simulated)" in error
    assert (out / "vllm_server.rank0.log").exists()


def test_vllm_server_that_never_gets_healthy_is_killed(tiny_verifier, prepared_data, tmp_path):
    out, record = tmp_path / "hs", tmp_path / "server.json"
    proc = run_script("extract_hidden_states.py", *_vllm_args(tiny_verifier, prepared_data, out, "hang", record, "--health-timeout", 3, "--stop-grace", 1), check=False)
    assert proc.returncode == 1
    assert "not healthy after 3 s" in read_events(tmp_path / "events.jsonl")[-1]["error"]
    assert not _alive(json.loads(record.read_text())["pid"])  # it ignored SIGTERM: SIGKILL after the grace


def test_vllm_server_is_stopped_when_the_client_fails(tiny_verifier, prepared_data, tmp_path):
    out, record = tmp_path / "hs", tmp_path / "server.json"
    client = f"{sys.executable} -c 'import sys; sys.exit(4)'"
    proc = run_script("extract_hidden_states.py", *_vllm_args(tiny_verifier, prepared_data, out, "health-only", record, "--offline-command", client), check=False)
    assert proc.returncode == 1
    assert "generate-offline-data exited with status 4" in read_events(tmp_path / "events.jsonl")[-1]["error"]
    assert not _alive(json.loads(record.read_text())["pid"])


def test_sigterm_of_the_stage_stops_server_and_client(tiny_verifier, prepared_data, tmp_path):
    import signal
    import subprocess
    import time

    from tests.fixtures.pipeline_data import offline_env

    out, record, client_pid = tmp_path / "hs", tmp_path / "server.json", tmp_path / "client.pid"
    client = f"{sys.executable} -c 'import os, time; open(\"{client_pid}\", \"w\").write(str(os.getpid())); time.sleep(300)'"
    argv = [sys.executable, str(SCRIPTS_DIR / "extract_hidden_states.py"), *map(str, _vllm_args(tiny_verifier, prepared_data, out, "health-only", record, "--offline-command", client))]
    stage = subprocess.Popen(argv, env=offline_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (client_pid.exists() and client_pid.read_text()) and time.monotonic() < deadline:
            assert stage.poll() is None, "the stage ended early"
            time.sleep(0.2)
        stage.send_signal(signal.SIGTERM)
        assert stage.wait(timeout=60) == 1
    finally:
        if stage.poll() is None:
            stage.kill()
    assert "cancelled" in read_events(tmp_path / "events.jsonl")[-1]["error"]
    assert not _alive(json.loads(record.read_text())["pid"])
    assert not _alive(int(client_pid.read_text()))


def test_writer_threads_follow_the_cpus_per_process():
    from extract_hidden_states import default_writer_threads

    assert default_writer_threads(2, 1) == 1  # a small box: one writer beside the compute thread
    assert default_writer_threads(32, 2) == 4  # 8 were no faster than 4 on an H200 box
    assert default_writer_threads(128, 8) == 4
    assert default_writer_threads(16, 8) == 1


def test_batches_run_longest_first_within_the_limits():
    lengths = {0: 10, 1: 300, 2: 50, 3: 300, 4: 12, 5: 299, 6: 1000}
    batches = plan_batches(lengths, batch_size=2, max_tokens=700)
    assert sorted(i for b in batches for i in b) == sorted(lengths)  # every sample exactly once
    assert batches[0] == [6]  # the longest alone: 2 x 1000 > 700
    assert all(len(b) <= 2 and max(lengths[i] for i in b) * len(b) <= 700 for b in batches[1:])
    widths = [max(lengths[i] for i in b) for b in batches]
    assert widths == sorted(widths, reverse=True)  # the last batch is the cheapest to write


def test_the_last_batch_is_split_into_single_rows_when_asked():
    lengths = {i: 100 for i in range(11)}
    whole = plan_batches(lengths, batch_size=4, max_tokens=10_000)
    assert [len(b) for b in whole] == [4, 4, 3]
    tapered = plan_batches(lengths, batch_size=4, max_tokens=10_000, tail_rows=1)
    assert [len(b) for b in tapered] == [4, 4, 1, 1, 1]
    assert [i for b in tapered for i in b] == [i for b in whole for i in b]  # same order, same samples
    assert [len(b) for b in plan_batches(lengths, 4, 10_000, tail_rows=2)] == [4, 4, 2, 1]
    assert plan_batches({}, 4, 10_000, tail_rows=1) == []


def test_writer_saves_a_batch_s_files_in_parallel_and_gives_the_buffer_back_once(tmp_path, monkeypatch):
    """One task per file: three files of one batch are in save_file at the same moment (a barrier
    that sequential writing would never pass), each lands under its final name with the row's
    states, and the batch's give-back runs once, after the last file."""
    import threading

    import safetensors.torch
    import torch
    from safetensors.torch import load_file

    from extract_hidden_states import AsyncWriter

    together = threading.Barrier(3, timeout=10)
    real_save = safetensors.torch.save_file

    def save_when_all_three_are_writing(tensors, path):
        together.wait()  # BrokenBarrierError if the rows were written one after another
        real_save(tensors, path)

    monkeypatch.setattr(safetensors.torch, "save_file", save_when_all_three_are_writing)
    gave_back = []
    batch = torch.arange(3 * 5 * 2 * 4, dtype=torch.float32).view(3, 5, 2, 4).to(torch.bfloat16)
    writer = AsyncWriter(tmp_path, threads=3, max_pending=2)
    writer.submit(batch, [5, 3, 4], [7, 8, 9], [torch.arange(n) for n in (5, 3, 4)], done=lambda: gave_back.append(len(list(tmp_path.glob("hs_*.safetensors")))))
    writer.close()
    assert gave_back == [3]  # once, when all three files were in place
    assert writer.written == 3
    for row, (index, n) in enumerate([(7, 5), (8, 3), (9, 4)]):
        got = load_file(str(hs_path(tmp_path, index)))
        assert torch.equal(got["hidden_states"], batch[row, :n])
        assert got["token_ids"].tolist() == list(range(n))
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_failed_file_still_gives_the_buffer_back_and_fails_the_drain(tmp_path, monkeypatch):
    import safetensors.torch
    import torch

    from extract_hidden_states import AsyncWriter

    def disk_full(tensors, path):
        Path(path).write_bytes(b"half a file")
        if path.startswith(str(hs_path(tmp_path, 1))):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    gave_back = []
    writer = AsyncWriter(tmp_path, threads=2)
    writer.submit(torch.zeros(2, 3, 1, 1), [3, 3], [0, 1], [torch.arange(3)] * 2, done=lambda: gave_back.append(True))
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert gave_back == [True]  # the pinned buffer returns to the ring even though a write failed
    assert not hs_path(tmp_path, 1).exists()  # nothing under the final name for the failed row
    assert hs_path(tmp_path, 0).exists() and not list(tmp_path.glob("*.tmp-*"))  # the half file is gone


def test_pinned_ring_hands_out_each_buffer_once_until_given_back():
    """The ring's bookkeeping (on CPU, unpinned): a taken buffer is not handed out again before
    the writer gives it back, the compute loop waits when all are out, and views have the
    batch's shape and dtype over distinct memory."""
    import threading

    import torch

    from extract_hidden_states import PinnedRing

    ring = PinnedRing(2, 4 * 3 * 2, pin=False)
    a, give_a = ring.take((4, 3), torch.bfloat16)
    b, give_b = ring.take((2, 3), torch.bfloat16)
    assert a.shape == (4, 3) and a.dtype == torch.bfloat16 and b.shape == (2, 3)
    a.fill_(1.0)
    b.fill_(2.0)
    assert bool((a == 1.0).all())  # no overlap between the two slots
    got = []
    waiter = threading.Thread(target=lambda: got.append(ring.take((4, 3), torch.bfloat16)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # both slots out: the loop waits (back-pressure)
    give_a()
    waiter.join(5)
    assert got and got[0][0].data_ptr() == a.data_ptr()  # the given-back slot, reused
    give_b()
    got[0][1]()
    assert ring.free.qsize() == 2


def test_stand_in_takes_only_what_vllm_documents():
    """The stand-in's parser is strict like vLLM's: the command line we compose passes it, and an
    unknown flag, method, connector or role is an error (exit 2) instead of being ignored."""
    from common.vllm_server import ServeOptions, serve_argv

    from tests.fixtures.vllm_stand_in import parse

    opts = ServeOptions(model="/models/m", layer_ids=[1, 3], num_layers=4, staging_dir="/tmp/s", max_model_len=512,
                        gpu_memory_utilization=0.8, vllm_command="vllm", extra_args=["--trust-remote-code"])
    argv = serve_argv(opts)[1:]  # after the executable: serve MODEL ...
    args = parse(argv)
    assert args.speculative_config["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert (args.max_model_len, args.gpu_memory_utilization, args.trust_remote_code) == (512, 0.8, True)

    def rejected(argv: list[str]) -> bool:
        try:
            parse(argv)
        except SystemExit as e:
            return e.code == 2
        return False

    def with_json(flag: str, **changes) -> list[str]:
        out = list(argv)
        i = out.index(flag) + 1
        out[i] = json.dumps({**json.loads(out[i]), **changes})
        return out

    assert rejected([*argv, "--no-such-flag"]) and rejected([*argv, "--max-model"])  # no abbreviations either
    assert rejected(with_json("--speculative-config", method="extract_hidden_state"))
    assert rejected(with_json("--speculative-config", num_speculative_tokens=3))
    assert rejected(with_json("--kv-transfer-config", kv_connector="HiddenStatesConnector"))
    assert rejected(with_json("--kv-transfer-config", kv_role="producer"))
    assert rejected(with_json("--kv-transfer-config", kv_connector="NixlConnector"))  # valid in vLLM, not emulated
