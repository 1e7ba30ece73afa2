"""prepare_data.py: chat JSONL -> speculators' prepared dataset with assistant-only loss masks."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))
import prepare_data  # noqa: E402

# The tiny verifier's template with HF's {% generation %} markers around what the assistant
# generates (its content and end-of-turn token): an independent source of the expected mask.
MARKED_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|assistant|> ' }}{% generation %}{{ message['content'] + ' <|end|>' }}{% endgeneration %}"
    "{% else %}{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _tokenizer(tiny_verifier):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_verifier.verifier)


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _prepare(*args) -> int:
    """Run the stage in this interpreter (the CLI path minus the ~10 s of imports per process)."""
    return prepare_data.main([str(a) for a in args])


def _load(path):
    from datasets import load_from_disk

    return load_from_disk(str(path))


def test_loss_mask_is_exactly_the_assistant_tokens(tiny_verifier, prepared_data):
    tokenizer = _tokenizer(tiny_verifier)
    rows = [json.loads(line) for line in tiny_verifier.data.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    dataset = _load(prepared_data)
    assert len(dataset) == len(train)
    assert dataset.format["type"] == "torch"  # speculators compares rows with torch.equal
    multi_turn = 0
    for row, prepared in zip(train, dataset):
        expected = tokenizer.apply_chat_template(row["messages"], chat_template=MARKED_TEMPLATE, return_assistant_tokens_mask=True, return_dict=True)
        assert prepared["input_ids"].tolist() == expected["input_ids"]
        assert prepared["loss_mask"].tolist() == expected["assistant_masks"]
        assert int(prepared["seq_len"]) == len(expected["input_ids"])
        multi_turn += len(row["messages"]) > 2
    assert multi_turn > 0
    # And in words: the masked tokens are the assistant turns, each closed by its end-of-turn token.
    first = dataset[0]
    replies = [m["content"] for m in train[0]["messages"] if m["role"] == "assistant"]
    assert tokenizer.decode(first["input_ids"][first["loss_mask"].bool()]) == " ".join(f"{r} <|end|>" for r in replies)


def test_token_freq_counts_assistant_tokens(prepared_data):
    import torch

    dataset = _load(prepared_data)
    expected = Counter()
    for row in dataset:
        expected.update(row["input_ids"][row["loss_mask"].bool()].tolist())
    assert torch.load(prepared_data / "token_freq.pt") == dict(expected)


def test_sharegpt_and_openai_rows_give_the_same_tokens(tiny_verifier, tmp_path):
    turns = [("user", "human", "aa bb"), ("assistant", "gpt", "cc dd"), ("user", "human", "ee"), ("assistant", "gpt", "ff gg hh")]
    messages = {"messages": [{"role": r, "content": c} for r, _, c in turns]}
    sharegpt = {"conversations": [{"from": f, "value": c} for _, f, c in turns]}
    for name, row in (("openai", messages), ("sharegpt", sharegpt)):
        assert _prepare("--verifier", tiny_verifier.verifier, "--data", _write_jsonl(tmp_path / f"{name}.jsonl", [row]), "--output", tmp_path / name) == 0
    a, b = _load(tmp_path / "openai")[0], _load(tmp_path / "sharegpt")[0]
    assert a["input_ids"].tolist() == b["input_ids"].tolist() and a["loss_mask"].tolist() == b["loss_mask"].tolist()
    # two assistant turns -> two separate masked spans
    mask = a["loss_mask"].tolist()
    assert sum(1 for x, y in zip([0, *mask], mask) if (x, y) == (0, 1)) == 2


def test_malformed_rows_are_reported_with_line_numbers_and_skipped(tiny_verifier, tmp_path):
    good = {"messages": [{"role": "user", "content": "aa"}, {"role": "assistant", "content": "bb cc"}]}
    data = _write_jsonl(
        tmp_path / "chat.jsonl",
        [
            good,
            '{"messages": [',  # line 2: invalid JSON
            good,
            {"prompt": "no conversation"},  # line 4
            {"messages": [{"role": "narrator", "content": "x"}]},  # line 5
            {"messages": [{"role": "user", "content": ["image"]}]},  # line 6
            good,
        ],
    )
    events = tmp_path / "events.jsonl"
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", tmp_path / "out", "--events", events) == 0
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert report["malformed"] == 4 and report["rows_kept"] == 3
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in report["malformed_lines"]] == ["2", "4", "5", "6"]
    messages = [e["text"] for e in read_events(events) if e["event"] == "message"]
    assert any(f"{data}:2: invalid JSON" in m for m in messages)
    assert any(f"{data}:5:" in m and "narrator" in m for m in messages)
    assert read_events(events)[-1]["malformed"] == 4

    strict_events = tmp_path / "strict.jsonl"
    proc = run_script("prepare_data.py", "--verifier", tiny_verifier.verifier, "--data", data, "--output", tmp_path / "strict", "--strict", "--events", strict_events, check=False)
    assert proc.returncode == 1
    finished = read_events(strict_events)[-1]
    assert finished["status"] == "failed" and f"{data}:2: invalid JSON" in finished["error"]
    assert not (tmp_path / "strict").exists()  # nothing half-written


def test_truncation_and_rows_without_supervision(tiny_verifier, tmp_path):
    long_user = " ".join(["aa"] * 40)
    data = _write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"messages": [{"role": "user", "content": "aa"}, {"role": "assistant", "content": " ".join(["bb"] * 40)}]},  # truncated
            {"messages": [{"role": "user", "content": long_user}, {"role": "assistant", "content": "bb"}]},  # reply cut away
            {"messages": [{"role": "user", "content": "only a prompt"}]},  # no assistant turn
        ],
    )
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", tmp_path / "out", "--max-seq-len", "16") == 0
    dataset = _load(tmp_path / "out")
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert len(dataset) == 1 and dataset[0]["seq_len"] == 16 and len(dataset[0]["input_ids"]) == 16
    assert report["truncated"] == 2 and report["no_supervised_tokens"] == 2


def test_rows_cut_are_reported_and_a_limit_sized_to_the_data_cuts_none(tiny_verifier, tmp_path):
    """Nothing is cut silently: the rows cut at max_seq_len and the reply tokens they lose, and the
    replies regenerate cut at its budget, are in the report and the stage's lines; max_seq_len 0
    sizes the limit to the longest row. The line also gives what extract will write."""
    from common.recipe import sized_seq_len

    rows = [{"messages": [{"role": "user", "content": "aa"}, {"role": "assistant", "content": " ".join(["bb"] * n)}]} for n in (4, 40, 60)]
    rows[2]["regenerated"] = {"tokens": 60, "finish": "length"}
    data = _write_jsonl(tmp_path / "chat.jsonl", rows)
    tokens = [len(_tokenizer(tiny_verifier).apply_chat_template(r["messages"], return_dict=True)["input_ids"]) for r in rows]
    events = tmp_path / "events.jsonl"
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", tmp_path / "cut", "--max-seq-len", tokens[0], "--events", events) == 0
    report = json.loads((tmp_path / "cut" / "prepare_report.json").read_text())
    assert report["truncated"] == 2 and report["truncated_share"] == round(2 / 3, 4) and report["longest_row"] == max(tokens)
    assert report["reply_tokens_cut"] == sum(tokens[1:]) - 2 * tokens[0] and report["replies_at_budget"] == 1
    said = " ".join(e.get("text", "") for e in read_events(events))
    assert f"2 of 3 rows (66.7%) cut at max_seq_len {tokens[0]}" in said and "1 of 3 rows have a regenerated reply cut" in said

    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", tmp_path / "sized", "--max-seq-len", 0) == 0
    report = json.loads((tmp_path / "sized" / "prepare_report.json").read_text())
    assert report["truncated"] == 0 and report["max_seq_len"] == sized_seq_len(max(tokens)) >= max(tokens)
    assert [len(r) for r in _load(tmp_path / "sized")["input_ids"]] == tokens
    hidden = json.loads((tiny_verifier.verifier / "config.json").read_text())["hidden_size"]
    assert report["total_tokens"] == sum(tokens) and report["hidden_state_bytes"] == sum(tokens) * (prepare_data.DEFAULT_TARGET_LAYERS + 1) * hidden * 2


def test_heldout_rows_are_left_for_evaluation(tiny_verifier, prepared_data, tmp_path):
    rows = tiny_verifier.data.read_text().splitlines()
    n_heldout = sum(json.loads(r)["split"] == "heldout" for r in rows)
    assert json.loads((prepared_data / "prepare_report.json").read_text())["skipped_split"] == n_heldout
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", tiny_verifier.data, "--output", tmp_path / "all", "--split", "all") == 0
    assert len(_load(tmp_path / "all")) == len(rows)


def test_rerun_replaces_its_own_output_but_never_foreign_files(tiny_verifier, tmp_path):
    data = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "aa"}, {"role": "assistant", "content": "bb"}]}])
    out = tmp_path / "out"
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", out) == 0
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", out) == 0
    assert len(_load(out)) == 1
    (out / "notes.txt").write_text("mine")
    assert _prepare("--verifier", tiny_verifier.verifier, "--data", data, "--output", out) == 1
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dirs left behind


def test_a_template_that_rewrites_history_falls_back_to_one_row_per_turn(tiny_verifier):
    tokenizer = _tokenizer(tiny_verifier)
    w = json.loads((tiny_verifier.verifier / "tiny_language.json").read_text())["chains"][0]
    # Earlier assistant turns are rendered empty (as reasoning templates drop old thinking).
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'assistant' and not loop.last %}{{ '<|assistant|> <|end|>' }}"
        "{% else %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' <|end|>' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    replies = [f"{w[1]} {w[2]}", w[4]]
    messages = [{"role": "user", "content": w[0]}, {"role": "assistant", "content": replies[0]}, {"role": "user", "content": w[3]}, {"role": "assistant", "content": replies[1]}]
    rows, fell_back = prepare_data.TemplateEncoder(tokenizer).rows(messages)
    assert fell_back and len(rows) == 2
    for (ids, mask), reply in zip(rows, replies):
        assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == f"{reply} <|end|>"
