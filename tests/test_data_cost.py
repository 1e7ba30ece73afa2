"""The data levers from the laptop's side: regenerate's and prepare's settings checked by their
parsers, in the stages' keys (a changed lever is another artifact, recorded in run.json's
recipes), and their cost said before a run (harness/data_cost.py, `harness run --dry-run`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import data_cost
from harness.config import load_config, with_overrides
from harness.errors import ConfigError, UsageError
from harness.host_helpers import artifact_store

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "remote_scripts"))
import regenerate  # noqa: E402
from common import recipe  # noqa: E402


def test_the_laptops_copy_of_the_rules_is_the_stages():
    assert (data_cost.AUTO_TARGET_REPLIES, data_cost.AUTO_MAX_PER_PROMPT) == (regenerate.AUTO_TARGET_REPLIES, regenerate.AUTO_MAX_PER_PROMPT)
    assert data_cost.AUTO_MAX_SEQ_LEN == recipe.AUTO_MAX_SEQ_LEN == recipe.sized_seq_len(10 * recipe.AUTO_MAX_SEQ_LEN)
    for given in (0, 1, 3):
        for prompts in (1, 100, 2001, 2667, 8000, 10**6):
            for gpu in (False, True):
                assert data_cost.replies_per_prompt(given, prompts, gpu) == regenerate.replies_per_prompt(given, prompts, gpu)


@pytest.fixture
def project(tmp_path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "remote_scripts").symlink_to(REPO / "remote_scripts")
    (project / "harness.toml").write_text(f'[hosts.box]\nlocal = true\nworkdir = "{tmp_path / "w"}"\n')
    return project


def test_each_lever_is_checked_and_changes_the_key_of_what_it_changes(project, tmp_path):
    from harness.artifacts import recipes

    config = load_config(project / "harness.toml")
    for setting, says in [("regenerate.loops=cut", "invalid value 'cut' (choices: keep, drop, trim)"),
                          ("regenerate.replies_per_prompt=many", "invalid value 'many' for --replies-per-prompt"),
                          ("regenerate.sample_temperature=hot", "invalid value 'hot' for --sample-temperature"),
                          ("regenerate.turns=every", "invalid value 'every' (choices: last, all)")]:
        with pytest.raises(UsageError, match=f"--set {setting.split('=')[0]}: " + says.replace("(", r"\(").replace(")", r"\)")):
            with_overrides(config, [setting])
    (project / "harness.toml").write_text((project / "harness.toml").read_text() + "[pipeline]\nmax_seq_len = 1\n")
    with pytest.raises(ConfigError, match="pipeline.max_seq_len.*expected 0 \\(sized to the data by prepare\\) or at least 2"):
        load_config(project / "harness.toml")

    work = tmp_path / "w"  # the box's workdir: the code the keys hold
    work.mkdir()
    (work / "remote_scripts").symlink_to(REPO / "remote_scripts")

    def keys(*settings: str) -> dict[str, str]:
        rec = recipes(with_overrides(config, list(settings)), ["regenerate", "prepare", "extract"], 1, [], "r")
        record = {"run_id": "r", "runtime": "host", "versions": {}, "image": {"id": None}, "store": "outputs/artifacts", "recipes": rec}
        k = artifact_store.Keys(str(work), record)
        return {stage: k.key(stage) for stage in ("regenerate", "prepare", "extract")}

    base = recipes(config, ["regenerate"], 1, [], "r")["regenerate"]["flags"]
    assert (base["replies_per_prompt"], base["loops"], base["sample_temperature"], base["turns"]) == (1, "keep", 1.0, "last")  # the script's defaults, recorded
    before = keys()
    for setting in ("regenerate.replies_per_prompt=2", "regenerate.loops=drop", "regenerate.sample_temperature=0.7", "regenerate.turns=all",
                    "regenerate.max_new_tokens=1024"):
        after = keys(setting)
        # regenerate's artifact is another (prepare's key takes it once it is made: an optional read, test_artifacts)
        assert after["regenerate"] != before["regenerate"] and after["prepare"] == before["prepare"], setting
    after = keys("prepare.max_seq_len=0")
    assert after["regenerate"] == before["regenerate"] and after["prepare"] != before["prepare"] and after["extract"] != before["extract"]


def test_the_dry_run_says_the_replies_tokens_and_hidden_state_bytes(project):
    from harness.run_start import DryRun, chain_cost

    facts = {"data_rows": 1000, "hidden_size": 64}
    chain = ["regenerate", "prepare", "extract", "train"]
    default = chain_cost(load_config(project / "harness.toml"), chain, facts)
    assert default.per_prompt == (1, 1)  # one reply a prompt unless asked
    config = with_overrides(load_config(project / "harness.toml"), ["regenerate.replies_per_prompt=0"])
    cost = chain_cost(config, chain, facts)
    layers = cost.layers
    assert cost.per_prompt == (1, data_cost.AUTO_MAX_PER_PROMPT)  # auto: more replies on a GPU, the prompts being few
    assert cost.hidden_state_bytes(True) == 1000 * data_cost.AUTO_MAX_PER_PROMPT * config.pipeline.max_seq_len * layers * 64 * 2
    dry = DryRun("box", chain, free_bytes=1 << 40, cost=cost)
    said = "\n".join(dry.lines())
    assert f"regenerate: up to {1000 * data_cost.AUTO_MAX_PER_PROMPT:,} replies (1000 rows x {data_cost.AUTO_MAX_PER_PROMPT} on a GPU, x 1 on a CPU)" in said
    assert f"1000 rows x {data_cost.AUTO_MAX_PER_PROMPT} replies on a GPU (1 on a CPU) x {config.pipeline.max_seq_len} tokens" in said
    assert dry.to_json()["cost"]["replies"] == 1000 * data_cost.AUTO_MAX_PER_PROMPT

    two = with_overrides(config, ["regenerate.replies_per_prompt=2", "prepare.max_seq_len=0"])
    assert chain_cost(two, chain, facts).per_prompt == (2, 2) and chain_cost(two, chain, facts).seq_len == data_cost.AUTO_MAX_SEQ_LEN
    sized = chain_cost(load_config(project / "harness.toml"), ["prepare", "extract"], facts)
    assert sized.per_prompt == (1, 1) and sized.replies(True) == 1000  # regenerate not in the chain: what it made is what it is
    assert chain_cost(config, ["regenerate", "prepare"], facts) is None  # no extract: no hidden states
