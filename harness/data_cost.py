"""What the data levers cost, said before a run (`harness run --dry-run`): the replies regenerate
writes and the hidden states extract writes from them, as upper bounds from the box's facts
(the data's rows, the verifier's width) and the config.

The rules are the stages' own: regenerate.replies_per_prompt (remote_scripts/regenerate.py) and
the sequence-length limit sized to the data (remote_scripts/common/recipe.py, sized_seq_len).
harness never imports remote_scripts/ (they run on the box, in its environment): this copy of
their constants is held to theirs by tests/test_data_cost.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AUTO_TARGET_REPLIES = 8000  # regenerate.AUTO_TARGET_REPLIES
AUTO_MAX_PER_PROMPT = 4  # regenerate.AUTO_MAX_PER_PROMPT
AUTO_MAX_SEQ_LEN = 4096  # common/recipe.py AUTO_MAX_SEQ_LEN: max_seq_len = 0 never goes above it


def replies_per_prompt(given: int, prompts: int, on_gpu: bool) -> int:
    """regenerate --replies-per-prompt resolved: the value given, else (0, auto) 1 on a CPU and, on
    a GPU, enough for about AUTO_TARGET_REPLIES replies, at most AUTO_MAX_PER_PROMPT per prompt."""
    if given > 0:
        return given
    if not on_gpu or prompts <= 0:
        return 1
    return max(1, min(AUTO_MAX_PER_PROMPT, -(-AUTO_TARGET_REPLIES // prompts)))


def seq_len_bound(max_seq_len: int) -> int:
    """The most tokens a prepared row has: max_seq_len, or (0: sized to the data) its ceiling."""
    return max_seq_len or AUTO_MAX_SEQ_LEN


@dataclass(frozen=True)
class DataCost:
    rows: int  # of the chat data (every prompt regenerate could answer)
    per_prompt: tuple[int, int]  # replies per prompt on a CPU, on a GPU (equal unless auto)
    seq_len: int  # the bound of a row's tokens
    layers: int  # hidden states per token: the target layers and the last
    hidden: int

    def replies(self, on_gpu: bool) -> int:
        return self.rows * self.per_prompt[on_gpu]

    def hidden_state_bytes(self, on_gpu: bool) -> int:
        return self.replies(on_gpu) * self.seq_len * self.layers * self.hidden * 2  # bf16

    def how(self) -> str:
        """How the figure is counted (the GPU's when auto makes them differ)."""
        cpu, gpu = self.per_prompt
        replies = f"{self.rows} rows" if gpu == 1 else f"{self.rows} rows x {gpu} replies" + (f" on a GPU ({cpu} on a CPU)" if cpu != gpu else "")
        return f"{replies} x {self.seq_len} tokens x {self.layers} layers x {self.hidden} x 2 B"

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "replies_per_prompt": {"cpu": self.per_prompt[0], "gpu": self.per_prompt[1]}, "replies": self.replies(True),
                "tokens": self.replies(True) * self.seq_len, "seq_len": self.seq_len, "hidden_states_bytes": self.hidden_state_bytes(True)}


def data_cost(pipeline, stages: list[str], rows: int | None, hidden: int | None, layers: int) -> DataCost | None:
    """The cost of `stages` on data of `rows` rows and a verifier `hidden` wide (None: unknown).
    Replies multiply only where regenerate runs in this chain (else its artifact, if any, was
    sized by the run that made it)."""
    if not rows or not hidden or "extract" not in stages:
        return None
    given = 1
    if "regenerate" in stages:
        value = pipeline.stages.get("regenerate", {}).get("replies_per_prompt", 1)
        given = int(value) if isinstance(value, (int, str)) and str(value).isdigit() else 0
    per_prompt = (replies_per_prompt(given, rows, False), replies_per_prompt(given, rows, True))
    max_seq_len = pipeline.stages.get("prepare", {}).get("max_seq_len", pipeline.max_seq_len)  # a stage table's value wins, as on its command line
    return DataCost(rows, per_prompt, seq_len_bound(int(max_seq_len)), layers, hidden)
