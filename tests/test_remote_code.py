"""Verifiers with code of their own (Kimi-K2.5's tiktoken tokenizer, loaded through `auto_map`):
`[pipeline] trust_remote_code` reaches every stage that loads the verifier or its tokenizer, the
stages then use the checkpoint's own tokenizer class, and doctor says when the checkpoint
declares code and the option is off."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from harness import host_helpers
from harness.config import PipelineConfig
from harness.doctor.verifier_checks import verdict_remote_code
from harness.pipeline import REMOTE_CODE_STAGES, STAGES, stage_argv
from tests.fixtures.pipeline_data import SCRIPTS_DIR, run_script
from tests.fixtures.requires import require_module
from tests.fixtures.tiktoken_tokenizer import CLASS_NAME, write_tiktoken_tokenizer

sys.path.insert(0, str(SCRIPTS_DIR))


def test_the_option_reaches_every_stage_that_loads_the_verifier_and_only_when_on():
    import importlib

    on, off = PipelineConfig(trust_remote_code=True), PipelineConfig()
    for stage in STAGES:
        assert "--trust-remote-code" not in stage_argv(stage, off)
        assert ("--trust-remote-code" in stage_argv(stage, on)) == (stage in REMOTE_CODE_STAGES), stage
    assert set(REMOTE_CODE_STAGES) == {"regenerate", "prepare", "extract", "train", "evaluate", "serve_check"}
    for stage in REMOTE_CODE_STAGES:  # each script takes the flag as the harness gives it
        module = importlib.import_module(STAGES[stage].script.removesuffix(".py"))
        assert module.parse_args(stage_argv(stage, on)[2:]).trust_remote_code is True, stage


def test_the_option_is_read_from_harness_toml(tmp_path):
    from harness.config import load_config

    path = tmp_path / "harness.toml"
    path.write_text('[hosts.local]\nlocal = true\nworkdir = "w"\n\n[pipeline]\ntrust_remote_code = true\n')
    assert load_config(path).pipeline.trust_remote_code is True
    path.write_text('[hosts.local]\nlocal = true\nworkdir = "w"\n')
    assert load_config(path).pipeline.trust_remote_code is False


@pytest.mark.parametrize(
    ("auto_map", "trust", "status"),
    [([], False, "ok"), (["config.json", "tokenizer_config.json"], False, "warn"), (["tokenizer_config.json"], True, "ok")],
)
def test_doctor_verdict_on_auto_map(auto_map, trust, status):
    result = verdict_remote_code({"found": True, "auto_map": auto_map}, trust)
    assert result.status == status
    if status == "warn":
        assert "config.json, tokenizer_config.json declare auto_map" in result.message and "trust_remote_code = true" in result.fix


# --- the real thing: a tiktoken tokenizer class shipped with the checkpoint --------------------


@pytest.fixture(scope="module")
def tiktoken_verifier(tiny_verifier, tmp_path_factory) -> Path:
    """The tiny verifier with its tokenizer replaced by the toy tiktoken one (same words, same
    special tokens and chat template, other ids)."""
    require_module("tiktoken")
    import make_tiny_verifier as tiny
    from common.tiny_models import ASSISTANT, BOS, END, PAD, SPECIAL_TOKENS, SYSTEM, UNK, USER

    out = tmp_path_factory.mktemp("tiktoken") / "verifier"
    shutil.copytree(tiny_verifier.verifier, out)
    language = json.loads((out / "tiny_language.json").read_text())
    words = sorted(w for chain in language["chains"] for w in chain)
    write_tiktoken_tokenizer(out, words, SPECIAL_TOKENS, tiny.CHAT_TEMPLATE, bos=BOS, eos=END, unk=UNK, pad=PAD)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = [USER, ASSISTANT, SYSTEM]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_prepare_with_trust_remote_code_uses_the_checkpoints_tokenizer(tiktoken_verifier, tiny_verifier, tmp_path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiktoken_verifier, trust_remote_code=True)
    assert type(tokenizer).__name__ == CLASS_NAME
    # Without the option transformers refuses, or (when it has a class for the model type, as for
    # kimi_k25) silently builds ANOTHER tokenizer from tiktoken.model: why doctor warns.
    try:
        builtin = AutoTokenizer.from_pretrained(tiktoken_verifier)
    except ValueError as e:
        assert "trust_remote_code" in str(e)
    else:
        assert type(builtin).__name__ != CLASS_NAME

    out = tmp_path / "prepared"
    args = ["--verifier", tiktoken_verifier, "--data", tiny_verifier.data, "--output", out, "--max-seq-len", 256, "--max-samples", 20]
    run_script("prepare_data.py", *args, "--trust-remote-code")
    rows = load_from_disk(str(out))
    first = json.loads(Path(tiny_verifier.data).read_text().splitlines()[0])["messages"]
    expected = tokenizer(tokenizer.apply_chat_template(first, tokenize=False), add_special_tokens=False)["input_ids"]
    ids = [int(i) for i in rows[0]["input_ids"]]
    assert ids == expected[: len(ids)]
    assert tokenizer.decode(ids).startswith("<bos><|user|> " + first[0]["content"])


def test_train_resolves_the_mask_token_through_the_remote_tokenizer(tiktoken_verifier):
    from common.speculators_compat import mask_token_id

    vocab = json.loads((tiktoken_verifier / "config.json").read_text())["vocab_size"]
    token_id, source = mask_token_id(str(tiktoken_verifier), vocab, trust_remote_code=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiktoken_verifier, trust_remote_code=True)
    # Its 1475 tokens exceed the toy's 407 embedding rows: no unused row, so the pad token.
    assert (token_id, source) == (tokenizer.pad_token_id, "the tokenizer's pad_token_id")


def test_doctor_probe_finds_the_auto_map(tiktoken_verifier):
    import importlib.util

    spec = importlib.util.spec_from_file_location("ml_probe", host_helpers.path("ml_probe.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    facts = probe.verifier_facts(str(tiktoken_verifier))
    assert facts["auto_map"] == ["tokenizer_config.json"]
    assert verdict_remote_code(facts, False).status == "warn"


def test_without_the_option_a_kimi_checkpoint_silently_gets_another_tokenizer(tiktoken_verifier, tmp_path):
    """transformers has a built-in tokenizer entry for model_type kimi_k25: without
    trust_remote_code it builds one from tiktoken.model instead of refusing, and its ids differ."""
    from transformers import AutoTokenizer

    kimi = tmp_path / "kimi"
    shutil.copytree(tiktoken_verifier, kimi)
    (kimi / "config.json").write_text(json.dumps({"model_type": "kimi_k25"}))
    own = AutoTokenizer.from_pretrained(kimi, trust_remote_code=True)
    builtin = AutoTokenizer.from_pretrained(kimi)
    assert type(own).__name__ == CLASS_NAME and type(builtin).__name__ != CLASS_NAME
    text = own.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    assert builtin(text, add_special_tokens=False)["input_ids"] != own(text, add_special_tokens=False)["input_ids"]
