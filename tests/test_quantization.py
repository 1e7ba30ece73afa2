"""Quantized verifiers: whether the transformers extraction backend can run a checkpoint's
`quantization_config` is decided from the config alone by transformers' own quantizer check;
when it cannot, extract fails in one line naming the vLLM backend before loading any weight,
and doctor says the same."""

from __future__ import annotations

import json
import sys

import pytest

from harness.doctor.verifier_checks import verdict_quantization
from tests.fixtures.pipeline_data import SCRIPTS_DIR, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))

# Kimi-K2.5's released weights: INT4 groups of 32, packed by compressed-tensors.
COMPRESSED_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}},
    "ignore": ["lm_head"],
}


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_unquantized_verifiers_have_no_verdict():
    from common.quantization import transformers_verdict

    assert transformers_verdict({"model_type": "llama"}) is None


@pytest.mark.skipif(_installed("compressed_tensors"), reason="compressed-tensors is installed: transformers can run it")
def test_compressed_tensors_without_its_package_names_the_vllm_backend():
    from common.quantization import transformers_verdict

    # Nested under text_config, as a multimodal checkpoint may hold it.
    verdict = transformers_verdict({"model_type": "kimi_k25", "text_config": {"quantization_config": COMPRESSED_INT4}})
    assert verdict is not None and not verdict.runs and verdict.method == "compressed-tensors"
    line = verdict.line()
    assert "\n" not in line and "compressed-tensors" in verdict.detail and "--backend vllm" in line


def test_an_unknown_method_cannot_run_either():
    from common.quantization import transformers_verdict

    verdict = transformers_verdict({"quantization_config": {"quant_method": "no-such-method"}})
    assert not verdict.runs and "no-such-method" in verdict.detail


@pytest.mark.skipif(_installed("compressed_tensors"), reason="compressed-tensors is installed: transformers can run it")
def test_extract_refuses_before_loading_the_verifier(tmp_path, prepared_data):
    # A verifier directory with a quantized config and NO weights: the stage must stop on the
    # config alone (loading would fail on the missing weights with another message).
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64, "quantization_config": COMPRESSED_INT4}))
    events = tmp_path / "events.jsonl"
    proc = run_script("extract_hidden_states.py", "--verifier", verifier, "--prepared", prepared_data, "--output", tmp_path / "hs", "--events", events, check=False)
    assert proc.returncode != 0
    finished = read_events(events)[-1]
    assert finished["status"] == "failed"
    assert "transformers backend cannot run it here" in finished["error"] and "--backend vllm" in finished["error"]
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
    import importlib.util
    from pathlib import Path

    from common.quantization import transformers_verdict

    spec = importlib.util.spec_from_file_location("ml_probe", Path(__file__).resolve().parents[1] / "harness" / "remote" / "ml_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": COMPRESSED_INT4}))
    facts = probe.verifier_facts(str(tmp_path))
    assert facts["quantization_config"] == COMPRESSED_INT4
    answer = probe.quantization_facts(facts["quantization_config"], "cpu")
    verdict = transformers_verdict({"quantization_config": COMPRESSED_INT4}, "cpu")
    assert (answer["runs"], answer["detail"]) == (verdict.runs, verdict.detail)
