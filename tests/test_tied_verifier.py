"""A verifier with tied input/output embeddings (SmolLM2 and other small models tie them) through
the stages that touch the embeddings and lm_head: prepare, extract, train (the draft takes both
from the verifier), evaluate; and import_verifier.py (a transformers directory -> the verifier
directory, logits checked, ties kept)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR, read_events, run_script
from tests.fixtures.requires import require_module

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))
torch = require_module("torch")
require_module("speculators")


@pytest.fixture(scope="module")
def tied_verifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    run_script(
        "make_tiny_verifier.py", "--output", root / "verifier", "--data-out", root / "chat.jsonl", "--tie-word-embeddings",
        "--conversations", "60", "--heldout", "4", "--train-steps", "30", "--events", root / "e.jsonl",
    )
    return root


def test_a_tied_verifier_through_train_and_evaluate(tied_verifier, tmp_path):
    from safetensors import safe_open

    import evaluate as ev
    from common.checkpoints import resolve_draft

    verifier, data = tied_verifier / "verifier", tied_verifier / "chat.jsonl"
    assert json.loads((verifier / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(verifier / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        embeddings = f.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in keys  # what makes a tied checkpoint different for the stages

    run_script("prepare_data.py", "--verifier", verifier, "--data", data, "--output", tmp_path / "prepared", "--max-seq-len", "128", "--events", tmp_path / "p.jsonl")
    run_script("extract_hidden_states.py", "--verifier", verifier, "--prepared", tmp_path / "prepared", "--output", tmp_path / "hs", "--batch-size", "8", "--events", tmp_path / "x.jsonl")
    run_script(
        "train_draft.py", "--verifier", verifier, "--prepared", tmp_path / "prepared", "--hidden-states", tmp_path / "hs",
        "--output", tmp_path / "ckpt", "--epochs", "1", "--max-steps", "3", "--total-seq-len", "128", "--events", tmp_path / "t.jsonl",
    )
    draft = ev.load_draft(resolve_draft(tmp_path / "ckpt")[0], str(verifier), "sdpa")
    # The draft's output head scores against the verifier's (tied) embeddings: without lm_head.weight
    # in the checkpoint it must come from them, not stay uninitialized.
    target = embeddings.to(draft.verifier_lm_head.weight.dtype)
    assert torch.equal(draft.verifier_lm_head.weight, target)
    assert not draft.lm_head.weight.isnan().any()

    run_script(
        "evaluate.py", "--verifier", verifier, "--draft", tmp_path / "ckpt", "--data", data, "--output", tmp_path / "eval",
        # 30 steps leave the verifier's first reply token near a tie with its end of turn (on one
        # CPU's numerics every reply ended there: no round, no tau): the replies run to the budget.
        "--max-prompts", "4", "--max-new-tokens", "24", "--ignore-eos", "--events", tmp_path / "ev.jsonl",
    )
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["prompts"] == 4 and report["greedy_match"] == 1.0
    assert report["generated_tokens"] == 4 * 24 and report["extra"]["ignore_eos"] is True
    assert report["tau"] == pytest.approx((4 * 24 - 4) / report["rounds"], abs=1e-4)  # 23 tokens after each prefill token, per round


def test_import_verifier_keeps_ties_and_logits(tied_verifier, tmp_path):
    out = tmp_path / "imported"
    (out / ".importing").mkdir(parents=True)  # an empty --output where an earlier import was killed mid-way
    (out / ".importing" / "config.json").write_text("{}")
    run_script("import_verifier.py", "--source", tied_verifier / "verifier", "--output", out, "--dtype", "float32", "--threads", "1", "--events", tmp_path / "i.jsonl")
    finished = read_events(tmp_path / "i.jsonl")[-1]
    assert finished["status"] == "ok" and finished["tied_embeddings"] is True
    assert any("logits equal after the reload" in e.get("text", "") for e in read_events(tmp_path / "i.jsonl"))
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(str(tied_verifier / "verifier"), dtype=torch.float32)
    imported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert imported.get_output_embeddings().weight.data_ptr() == imported.get_input_embeddings().weight.data_ptr()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(source(input_ids=ids).logits, imported(input_ids=ids).logits)
    made_from = json.loads((out / "imported_from.json").read_text())
    weights = sum(f.stat().st_size for f in (tied_verifier / "verifier").iterdir() if f.name == "config.json" or f.suffix == ".safetensors")
    assert made_from == {"source": "verifier", "source_bytes": weights, "dtype": "float32"}
    assert not (out / ".importing").exists()  # staged inside it, moved up once checked


def test_import_verifier_refuses_a_non_empty_output_and_a_missing_source(tied_verifier, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    proc = run_script("import_verifier.py", "--source", tied_verifier / "verifier", "--output", tmp_path / "full", "--events", tmp_path / "a.jsonl", check=False)
    assert proc.returncode != 0 and "exists and is not empty" in read_events(tmp_path / "a.jsonl")[-1]["error"]
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    proc = run_script("import_verifier.py", "--source", tmp_path / "nothing.gguf", "--output", tmp_path / "o", "--events", tmp_path / "b.jsonl", check=False)
    assert proc.returncode != 0 and "no such file or directory" in read_events(tmp_path / "b.jsonl")[-1]["error"]
