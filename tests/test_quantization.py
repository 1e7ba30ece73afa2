"""Quantized verifiers: whether the transformers extraction backend can run a checkpoint's
`quantization_config` is decided from the config alone by transformers' own quantizer check.

Where it can: a toy verifier in Kimi-K2.5's INT4 compressed-tensors format goes through the real
extract stage, whose hidden states equal transformers' own computation on that checkpoint, and
doctor says which quantizer loads it. compressed-tensors is in the dev extra, so CI runs these;
without it they fail under CI and are skipped (and listed) elsewhere.

Where it cannot: extract fails in one line naming the vLLM backend before loading any weight, and
doctor says the same. Shown with compressed-tensors made unimportable in the stage's interpreter
(a sitecustomize that marks it missing in sys.modules, which is what transformers' availability
check, importlib.util.find_spec, then reports), so it runs whether or not the package is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.doctor.ml_checks import PROBE_MARKER
from harness.doctor.verifier_checks import verdict_quantization
from tests.fixtures.beds import bed_unavailable
from tests.fixtures.int4_verifier import COMPRESSED_INT4, quantize_int4
from tests.fixtures.pipeline_data import REPO_ROOT, SCRIPTS_DIR, offline_env, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))

PROBE = REPO_ROOT / "harness" / "host_helpers" / "ml_probe.py"


def env_without(tmp_path: Path, package: str) -> dict[str, str]:
    """An offline stage environment in which `package` cannot be imported, installed or not."""
    blocker = tmp_path / f"without_{package}"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(f"import sys\nsys.modules[{package!r}] = None  # find_spec -> None, import -> ImportError\n")
    return offline_env(PYTHONPATH=os.pathsep.join([str(blocker), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def verdict_in(env: dict[str, str], config: dict) -> dict:
    code = "import json, sys; from dataclasses import asdict; from common.quantization import transformers_verdict; print(json.dumps(asdict(transformers_verdict(json.loads(sys.argv[1])))))"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=300, env=env, cwd=SCRIPTS_DIR, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def test_unquantized_verifiers_have_no_verdict():
    from common.quantization import transformers_verdict

    assert transformers_verdict({"model_type": "llama"}) is None


def test_compressed_tensors_without_its_package_names_the_vllm_backend(tmp_path):
    from common.quantization import QuantizationVerdict

    # Nested under text_config, as a multimodal checkpoint may hold it.
    verdict = QuantizationVerdict(**verdict_in(env_without(tmp_path, "compressed_tensors"), {"model_type": "kimi_k25", "text_config": {"quantization_config": COMPRESSED_INT4}}))
    assert not verdict.runs and verdict.method == "compressed-tensors"
    line = verdict.line()
    assert "\n" not in line and "compressed-tensors" in verdict.detail and "--backend vllm" in line


def test_an_unknown_method_cannot_run_either():
    from common.quantization import transformers_verdict

    verdict = transformers_verdict({"quantization_config": {"quant_method": "no-such-method"}})
    assert not verdict.runs and "no-such-method" in verdict.detail


def test_extract_refuses_before_loading_the_verifier(tmp_path, prepared_data):
    # A verifier directory with a quantized config and NO weights: the stage must stop on the
    # config alone (loading would fail on the missing weights with another message).
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64, "quantization_config": COMPRESSED_INT4}))
    events = tmp_path / "events.jsonl"
    proc = run_script("extract_hidden_states.py", "--verifier", verifier, "--prepared", prepared_data, "--output", tmp_path / "hs", "--events", events,
                      check=False, env=env_without(tmp_path, "compressed_tensors"))
    assert proc.returncode != 0
    finished = read_events(events)[-1]
    assert finished["status"] == "failed"
    assert "transformers backend cannot run it here" in finished["error"] and "compressed-tensors" in finished["error"] and "--backend vllm" in finished["error"]
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "hs").glob("hs_*.safetensors"))


def test_doctor_verdicts():
    cannot = {"found": True, "quantization_config": COMPRESSED_INT4, "quantization": {"method": "compressed-tensors", "runs": False, "detail": "compressed-tensors>=0.15.0 is required"}}
    can = {"found": True, "quantization_config": {"quant_method": "fp8"}, "quantization": {"method": "fp8", "runs": True, "detail": "transformers' FineGrainedFP8HfQuantizer"}}
    result = verdict_quantization(cannot, "transformers")
    assert result.status == "fail" and "compressed-tensors>=0.15.0 is required" in result.message and 'backend = "vllm"' in result.fix
    assert verdict_quantization(cannot, "vllm").status == "ok"
    result = verdict_quantization(can, "transformers")
    assert result.status == "ok" and "FineGrainedFP8HfQuantizer" in result.message
    assert verdict_quantization({"found": True}, "transformers").message == "not quantized"


def test_the_probe_asks_transformers_the_same_question(tmp_path):
    from common.quantization import transformers_verdict

    spec = importlib.util.spec_from_file_location("ml_probe", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": COMPRESSED_INT4}))
    facts = probe.verifier_facts(str(tmp_path))
    assert facts["quantization_config"] == COMPRESSED_INT4
    answer = probe.quantization_facts(facts["quantization_config"], "cpu")
    verdict = transformers_verdict({"quantization_config": COMPRESSED_INT4}, "cpu")
    assert (answer["runs"], answer["detail"]) == (verdict.runs, verdict.detail)


# --- the "can" path: a toy INT4 verifier through the transformers backend ---

@pytest.fixture(scope="module")
def int4_verifier(request, tmp_path_factory) -> Path:
    if importlib.util.find_spec("compressed_tensors") is None:  # before the verifier is trained
        bed_unavailable("compressed-tensors", "the package is not installed (the dev extra installs it: scripts/setup.sh --dev)")
    return quantize_int4(request.getfixturevalue("tiny_verifier").verifier, tmp_path_factory.mktemp("int4") / "verifier")


def reference(model_path: Path, layers: list[int]):
    """transformers' own forward, not the product's hooks (the vLLM stand-in's computation):
    output_hidden_states at each target layer, then the last layer's output before the final norm.
    Loaded the plain way: compressed-tensors unpacks its weights on the whole model's first forward."""
    import torch

    from tests.fixtures.vllm_stand_in import Extractor

    threads = torch.get_num_threads()  # the stand-in runs on one thread: not the rest of this session
    try:
        return Extractor(str(model_path), layers + [json.loads((model_path / "config.json").read_text())["num_hidden_layers"]])
    finally:
        torch.set_num_threads(threads)


def test_an_int4_verifier_extracts_through_the_transformers_backend(int4_verifier, tiny_verifier, prepared_data, tmp_path):
    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file

    config = json.loads((int4_verifier / "config.json").read_text())["quantization_config"]
    assert {k: config[k] for k in ("quant_method", "format", "ignore")} == {k: COMPRESSED_INT4[k] for k in ("quant_method", "format", "ignore")}
    assert {k: config["config_groups"]["group_0"]["weights"][k] for k in COMPRESSED_INT4["config_groups"]["group_0"]["weights"]} == COMPRESSED_INT4["config_groups"]["group_0"]["weights"]

    rows = load_from_disk(str(prepared_data))
    subset = tmp_path / "prepared"
    rows.select([0, 1, 2]).save_to_disk(str(subset))
    rows = load_from_disk(str(subset)).with_format("torch")
    events = tmp_path / "events.jsonl"
    run_script("extract_hidden_states.py", "--verifier", int4_verifier, "--prepared", subset, "--output", tmp_path / "hs", "--events", events)
    log = read_events(events)
    assert log[-1]["status"] == "ok"
    said = [e["text"] for e in log if e.get("event") == "message"]
    assert "the verifier is quantized (compressed-tensors): the transformers backend loads it through transformers' CompressedTensorsHfQuantizer" in said
    layers = json.loads((tmp_path / "hs" / "extract_meta.json").read_text())["target_layer_ids"]

    int4, full = reference(int4_verifier, layers), reference(tiny_verifier.verifier, layers)
    tokens = agree = 0
    for i in range(len(rows)):
        ids = rows[i]["input_ids"]
        saved = load_file(str(tmp_path / "hs" / f"hs_{i}.safetensors"))
        assert torch.equal(saved["token_ids"], ids)
        with torch.no_grad():
            quantized, unquantized = int4.states(ids[None]), full.states(ids[None])
        # Equal up to the bf16 the stage stores: rtol is one bf16 step, 2**-7 (rounding to nearest
        # costs half of one; fp32 sdpa here vs eager there may tip a value over a rounding edge);
        # atol only for fp32 noise on values near zero.
        torch.testing.assert_close(saved["hidden_states"].float(), quantized, rtol=2**-7, atol=1e-5 * float(quantized.abs().max()))
        # Close to the unquantized verifier, and not equal to it (the weights really are INT4):
        # rounding to 4 bits in groups of 32 moves each weight by up to half a step (its group's
        # max / 7), on the order of 10% of the weights' size, and the states move by about that
        # much (10% measured on the demo's verifier); 25% leaves room for another trained toy.
        error = (quantized - unquantized).norm(dim=(0, 2)) / unquantized.norm(dim=(0, 2))
        assert 0.01 < float(error.min()) and float(error.max()) < 0.25, error
        with torch.no_grad():
            agree += int((int4.model(input_ids=ids[None]).logits.argmax(-1) == full.model(input_ids=ids[None]).logits.argmax(-1)).sum())
        tokens += len(ids)
    # Greedy tokens mostly survive INT4 (96% measured); wrong scales or packing would leave chance (1/400).
    assert agree >= 0.9 * tokens, f"the INT4 verifier's greedy tokens agree with the unquantized one's on {agree}/{tokens}"


def test_doctor_says_which_quantizer_loads_an_int4_verifier(int4_verifier):
    proc = subprocess.run([sys.executable, str(PROBE), json.dumps({"verifier": str(int4_verifier), "flex": False})], capture_output=True, text=True, timeout=300, env=offline_env(), check=True)
    facts = json.loads(proc.stdout.split(PROBE_MARKER, 1)[1])
    assert facts["verifier"]["quantization"] == {"method": "compressed-tensors", "runs": True, "detail": "transformers' CompressedTensorsHfQuantizer"}
    result = verdict_quantization(facts["verifier"], "transformers")
    assert result.status == "ok" and result.message == "quantized (compressed-tensors): the transformers backend loads it through transformers' CompressedTensorsHfQuantizer"
