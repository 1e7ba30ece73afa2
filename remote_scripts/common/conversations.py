"""Chat data rows: one conversation per JSONL line, OpenAI-style {"messages": [{"role", "content"}]}
or ShareGPT {"conversations": [{"from", "value"}]}, with an optional "split" ("heldout" rows are
evaluation prompts, the test split; "selection" rows choose recipes: harness sweep) and an optional
"category" (evaluate reports tau per category).

prepare_data.py and regenerate.py parse rows with parse_conversation (a bad row is a MalformedRow
naming what is wrong); evaluate.py and serve_check.py take their held-out prompts with
load_prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

ROLE_ALIASES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system", "tool": "tool"}
MAX_REPORTED_LINES = 20  # malformed rows listed by line in a stage's report; the rest are counted


class MalformedRow(ValueError):
    """A data row that cannot be used; the message names what is wrong (the caller adds the line)."""


def parse_conversation(line: str) -> tuple[list[dict[str, str]], str | None]:
    """One JSONL line -> (normalized messages, split). Raises MalformedRow."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise MalformedRow(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise MalformedRow(f"expected a JSON object, got {type(row).__name__}")
    if "messages" in row:
        turns, role_key, content_key = row["messages"], "role", "content"
    elif "conversations" in row:
        turns, role_key, content_key = row["conversations"], "from", "value"
    else:
        raise MalformedRow("no 'messages' (OpenAI style) or 'conversations' (ShareGPT) field")
    if not isinstance(turns, list) or not turns:
        raise MalformedRow("the conversation must be a non-empty list of turns")
    messages = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise MalformedRow(f"turn {k} is not an object")
        role = turn.get(role_key, turn.get("role"))
        content = turn.get(content_key, turn.get("content"))
        if role not in ROLE_ALIASES:
            raise MalformedRow(f"turn {k} has unknown role {role!r}")
        if not isinstance(content, str):
            raise MalformedRow(f"turn {k} content is {type(content).__name__}, expected text")
        messages.append({"role": ROLE_ALIASES[role], "content": content})
    split = row.get("split")
    return messages, split if isinstance(split, str) else None


class NoPrompts(ValueError):
    """The data holds no usable held-out prompts (or is not JSONL); the message says which file and why."""


def load_prompts(tokenizer, data: Path, split: str, max_prompts: int) -> list[list[int]]:
    """Token ids of the held-out prompts: each assistant turn's preceding conversation plus the
    generation prompt."""
    return load_categorized_prompts(tokenizer, data, split, max_prompts)[0]


def load_categorized_prompts(tokenizer, data: Path, split: str, max_prompts: int) -> tuple[list[list[int]], list[str | None]]:
    """load_prompts, and each prompt's row "category" (coding, math, ...: bench/quality/prompts.py
    writes them; None where the row has none)."""
    rows, line_no = [], 0
    with open(data, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise NoPrompts(f"{data}:{line_no}: not JSON ({e.msg})") from None
            if split == "all" or row.get("split") == split:
                rows.append(row)
    if not rows:
        where = "bench/quality/prompts.py --selection N writes them (harness sweep measures on them)" if split == "selection" else "make_tiny_verifier writes them, or pass --split all"
        raise NoPrompts(f"{data}: no rows with split={split!r} (held-out prompts); {where}")
    prompts, categories = [], []
    for row in rows:
        category = row.get("category") if isinstance(row.get("category"), str) else None
        messages = row.get("messages") or _sharegpt(row.get("conversations") or [])
        # Every assistant turn's context, and a conversation that ends with a user turn (a prompt
        # with no reply yet) as a whole.
        ends = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
        if messages and messages[-1].get("role") == "user":
            ends.append(len(messages))
        for i in ends:
            text = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            categories.append(category)
            if len(prompts) >= max_prompts:
                return prompts, categories
    return prompts, categories


def _sharegpt(conversations: list[dict]) -> list[dict]:
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    return [{"role": roles.get(c.get("from", ""), c.get("from", "")), "content": c.get("value", "")} for c in conversations]
