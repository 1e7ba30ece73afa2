"""make_tiny_verifier.py: a verifier, tokenizer and learnable chat language built with no hub access."""

from __future__ import annotations

import json
import random
import sys

import pytest

from tests.fixtures.pipeline_data import FIXTURE_HELDOUT, SCRIPTS_DIR, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))
import make_tiny_verifier as tiny  # noqa: E402


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_language_is_deterministic_and_every_word_has_one_successor():
    a, b = tiny.ChainLanguage(tiny.LanguageSpec(seed=3)), tiny.ChainLanguage(tiny.LanguageSpec(seed=3))
    assert a.chains == b.chains
    assert a.chains != tiny.ChainLanguage(tiny.LanguageSpec(seed=4)).chains
    assert sorted(w for c in a.chains for w in c) == sorted(a.words)  # a partition of the vocabulary
    assert all(len(c) >= tiny.LanguageSpec().min_chain for c in a.chains)
    convo = a.conversation(random.Random(0), turns=2)
    for user, reply in zip(convo[::2], convo[1::2]):
        words = [user["content"].split()[-1], *reply["content"].split()]
        assert all(a.successor[x] == y for x, y in zip(words, words[1:]))
        assert a.successor[words[-1]] is None  # the reply ends where its chain ends


def test_verifier_and_tokenizer_load_offline(tiny_verifier):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_verifier.verifier)
    tokenizer = AutoTokenizer.from_pretrained(tiny_verifier.verifier)
    assert config.model_type == "llama" and config.num_hidden_layers >= 7
    assert config.vocab_size == len(tokenizer)
    assert str(config.dtype).removeprefix("torch.") == "float32"
    assert config.tie_word_embeddings is False  # speculators loads lm_head.weight from the checkpoint
    assert tokenizer.is_fast
    assert tokenizer.eos_token == "<|end|>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    messages = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "fine thanks"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<bos><|user|> hello world <|end|><|assistant|> fine thanks <|end|>"
    assert tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True).endswith("<|end|><|assistant|>")


def test_data_follows_the_language_and_holds_out_a_split(tiny_verifier):
    chains = json.loads((tiny_verifier.verifier / "tiny_language.json").read_text())["chains"]
    successor = {w: (c[i + 1] if i + 1 < len(c) else None) for c in chains for i, w in enumerate(c)}
    rows = _rows(tiny_verifier.data)
    assert sum(r["split"] == "heldout" for r in rows) == FIXTURE_HELDOUT
    assert {r["split"] for r in rows} == {"train", "heldout"}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        for user, reply in zip(row["messages"][::2], row["messages"][1::2]):
            words = [user["content"].split()[-1], *reply["content"].split()]
            assert all(successor[x] == y for x, y in zip(words, words[1:]))


def test_verifier_learned_the_language(tiny_verifier):
    """Greedy accuracy on held-out assistant tokens, measured here, agrees with the script's report
    and is far above chance (1/400)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_verifier.verifier)
    model = AutoModelForCausalLM.from_pretrained(tiny_verifier.verifier).eval()
    heldout = [r for r in _rows(tiny_verifier.data) if r["split"] == "heldout"]
    correct = total = 0
    with torch.no_grad():
        for row in heldout:
            ids, mask = tiny.encode_conversation(tokenizer, row["messages"])
            pred = model(torch.tensor([ids])).logits[0, :-1].argmax(-1)
            target, on = torch.tensor(ids[1:]), torch.tensor(mask[1:], dtype=torch.bool)
            correct += int((pred[on] == target[on]).sum())
            total += int(on.sum())
    accuracy = correct / total
    reported = tiny_verifier.finished_event()["heldout_token_accuracy"]
    assert abs(accuracy - reported) < 0.02
    assert accuracy > 0.5


def test_too_few_layers_is_one_clear_error(tmp_path):
    events = tmp_path / "events.jsonl"
    proc = run_script("make_tiny_verifier.py", "--output", tmp_path / "v", "--data-out", tmp_path / "d.jsonl", "--num-layers", "6", "--train-steps", "0", "--events", events, check=False)
    assert proc.returncode == 1
    finished = read_events(events)[-1]
    assert finished["event"] == "finished" and finished["status"] == "failed"
    assert "at least 7" in finished["error"] and "\n" not in finished["error"]
    assert not (tmp_path / "v").exists() and not (tmp_path / "d.jsonl").exists()


def test_stage_command_lines_from_the_harness_are_accepted():
    """harness.pipeline composes these stages' flags; each script must parse them as given."""
    from harness.config import PipelineConfig
    from harness.pipeline import stage_argv

    import extract_hidden_states
    import prepare_data

    config = PipelineConfig(target_layer_ids=[2, 5])
    for stage, module in (("verifier", tiny), ("prepare", prepare_data), ("extract", extract_hidden_states)):
        argv = stage_argv(stage, config, events_path="runs/r1/events.jsonl")
        args = module.parse_args(argv[2:])
        assert args.events == "runs/r1/events.jsonl"
    assert extract_hidden_states.parse_args(stage_argv("extract", config)[2:]).layers == [2, 5]


def test_a_layout_without_the_kimi_arch_is_one_clear_error(tmp_path):
    events = tmp_path / "events.jsonl"
    proc = run_script("make_tiny_verifier.py", "--output", tmp_path / "v", "--data-out", tmp_path / "d.jsonl", "--layout", "released", "--train-steps", "0", "--events", events, check=False)
    assert proc.returncode == 1
    finished = read_events(events)[-1]
    assert finished["status"] == "failed" and "--layout released is for --arch kimi-k2.5" in finished["error"]
    assert not (tmp_path / "v").exists()
