"""export.py: a directory vLLM can serve as an EAGLE-3 speculator, with an absolute verifier path,
and the exact serve command."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from tests.fixtures.requires import require_module  # noqa: E402
require_module("torch")
require_module("speculators")

import export as ex  # noqa: E402

from tests.fixtures.pipeline_data import REPO_ROOT, read_events, run_script  # noqa: E402


def _config(**overrides):
    config = {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"model_type": "llama", "hidden_size": 64},
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "verifier": {"name_or_path": "relative/verifier", "architectures": ["LlamaForCausalLM"]},
        },
    }
    config.update(overrides)
    return config


def test_export_config_records_the_given_verifier_and_keeps_the_rest():
    original = _config()
    out = ex.export_config(original, "/abs/verifier")
    assert out["speculators_config"]["verifier"]["name_or_path"] == "/abs/verifier"
    assert original["speculators_config"]["verifier"]["name_or_path"] == "relative/verifier"  # not mutated
    assert ex.speculative_tokens(out) == 5


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_config(speculators_model_type="dflash"), "not an EAGLE-3 draft"),
        ({k: v for k, v in _config().items() if k != "transformer_layer_config"}, "no transformer_layer_config"),
        (_config(speculators_config={"verifier": {}}), "no speculators_config.proposal_methods"),
    ],
)
def test_export_config_refuses_what_vllm_cannot_serve(config, message):
    with pytest.raises(ex.ExportError, match=message):
        ex.export_config(config, "/abs/verifier")


def test_serve_commands():
    [first] = ex.serve_commands("/models/verifier", "/out/export", 3)  # not `vllm serve EXPORT_DIR`: 0.33 refuses a local verifier
    assert first[:3] == ["vllm", "serve", "/models/verifier"] and first[3] == "--speculative-config"
    assert json.loads(first[4]) == {"method": "eagle3", "model": "/out/export", "num_speculative_tokens": 3}
    assert shlex.split(shlex.join(first)) == first  # printable and pasteable as one shell line


@pytest.fixture(scope="module")
def checkpoint(tiny_verifier, prepared_data, hidden_states, tmp_path_factory):
    out = tmp_path_factory.mktemp("export_draft") / "checkpoints"
    run_script(
        "train_draft.py", "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states,
        "--output", out, "--epochs", "1", "--max-steps", "2", "--total-seq-len", "256", "--events", out.parent / "events.jsonl",
    )
    return out


def test_export_stage(tiny_verifier, checkpoint, tmp_path):
    out = tmp_path / "export"
    relative_verifier = os.path.relpath(tiny_verifier.verifier, REPO_ROOT)  # the script runs in REPO_ROOT
    proc = run_script("export.py", "--draft", checkpoint, "--verifier", relative_verifier, "--output", out, "--events", tmp_path / "e.jsonl")
    config = json.loads((out / "config.json").read_text())
    recorded = config["speculators_config"]["verifier"]["name_or_path"]
    assert os.path.isabs(recorded) and Path(recorded) == Path(tiny_verifier.verifier).resolve()
    assert config["speculators_model_type"] == "eagle3"
    assert (out / "model.safetensors").stat().st_size == (checkpoint / "0" / "model.safetensors").stat().st_size
    assert not any(p.name.startswith("optimizer") for p in out.iterdir())
    command = proc.stdout.strip().splitlines()[-1]
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "serve", recorded]
    assert json.loads(argv[4]) == {"method": "eagle3", "model": str(out.resolve()), "num_speculative_tokens": 3}
    assert (out / "serve_command.txt").read_text().splitlines()[0] == command
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "ok" and finished["serve_command"] == command

    # Exporting again replaces the directory whole and leaves nothing behind.
    (out / "stale-file").write_text("x")
    run_script("export.py", "--draft", checkpoint / "0", "--verifier", tiny_verifier.verifier, "--output", out)
    assert not (out / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.jsonl", "export"]


def test_export_takes_the_checkpoint_best_json_names_not_the_latest(tiny_verifier, checkpoint, tmp_path):
    trained = tmp_path / "checkpoints"
    shutil.copytree(checkpoint, trained, symlinks=True)
    shutil.copytree(trained / "0", trained / "1")  # a later epoch whose estimate was worse
    best = json.loads((trained / "best.json").read_text())
    assert best["checkpoint"] == "0"
    run_script("export.py", "--draft", trained, "--verifier", tiny_verifier.verifier, "--output", tmp_path / "export", "--no-check")
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert manifest["source_checkpoint"] == str((trained / "0").resolve()) and manifest["training_tau"] == best["tau"]
    (trained / "best.json").unlink()  # no record: the latest epoch, as before
    run_script("export.py", "--draft", trained, "--verifier", tiny_verifier.verifier, "--output", tmp_path / "export", "--no-check")
    assert json.loads((tmp_path / "export" / "export.json").read_text())["source_checkpoint"] == str((trained / "1").resolve())


def test_export_without_a_checkpoint_fails_with_one_line(tiny_verifier, tmp_path):
    proc = run_script("export.py", "--draft", tmp_path / "none", "--verifier", tiny_verifier.verifier, "--output", tmp_path / "export", "--events", tmp_path / "e.jsonl", check=False)
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "failed" and "no checkpoint" in finished["error"]
    assert not (tmp_path / "export").exists()
