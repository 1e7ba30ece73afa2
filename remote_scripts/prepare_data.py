"""Chat data -> speculators' prepared dataset: `input_ids`, `loss_mask` (assistant tokens only), `seq_len`.

speculators 0.9.0's own `prepare-data` renders conversations through a running vLLM server's
/render endpoint; this stage renders them locally with the verifier's tokenizer and chat template,
so it runs anywhere (the laptop demo included) and writes the same on-disk format: OUTPUT/ (a
`datasets` dataset, one row per conversation), OUTPUT/token_freq.pt (assistant-token counts, for
the draft's reduced vocabulary) and OUTPUT/prepare_report.json. The loss mask follows speculators'
render-boundary rule. Input forms, held-out rows, the mask, malformed rows and `--regenerated`:
docs/pipeline.md, "Prepare".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.conversations import MAX_REPORTED_LINES, MalformedRow, parse_conversation  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402
from common.regenerated_data import file_sha256, meta_file  # noqa: E402

STAGE = "prepare"
# Files this stage writes: only a directory holding nothing else may be replaced by a rerun.
OWN_FILES = {"dataset_info.json", "state.json", "token_freq.pt", "prepare_report.json"}


@dataclass
class PrepareReport:
    rows_read: int = 0
    rows_kept: int = 0  # output rows (a non-prefix-stable template can give several per conversation)
    malformed: int = 0
    malformed_lines: list[str] = field(default_factory=list)  # "line 7: ..." (the first few)
    skipped_split: int = 0
    no_supervised_tokens: int = 0  # no assistant token left (no assistant turn, or truncated away)
    truncated: int = 0
    per_turn_fallback: int = 0
    assistant_tokens: int = 0
    total_tokens: int = 0


class TemplateEncoder:
    """Renders conversations with the verifier's chat template and derives assistant loss masks."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the verifier's tokenizer has no chat template")
        self.tokenizer = tokenizer

    def encode(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        # The template already places BOS and the other special tokens (as HF's tokenize=True does).
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def rows(self, messages: list[dict[str, str]]) -> tuple[list[tuple[list[int], list[int]]], bool]:
        """-> ([(input_ids, loss_mask), ...], fell_back_to_per_turn_rows)."""
        full = self.encode(messages)
        mask = [0] * len(full)
        per_turn: list[tuple[list[int], list[int]]] = []
        stable = True
        for j, turn in enumerate(messages):
            # An assistant turn with no context before it has no boundary: it stays context.
            if turn["role"] != "assistant" or j == 0:
                continue
            prompt = self.encode(messages[:j], add_generation_prompt=True)
            through = self.encode(messages[: j + 1])
            boundary = len(prompt) if through[: len(prompt)] == prompt else _common_prefix(prompt, through)
            per_turn.append((through, [0] * boundary + [1] * (len(through) - boundary)))
            if full[: len(through)] != through or boundary != len(prompt):
                stable = False
            else:
                mask[boundary : len(through)] = [1] * (len(through) - boundary)
        if stable:
            return [(full, mask)], False
        return per_turn, True


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def choose_data(data: str, regenerated: str | None, events: EventLog) -> str:
    """--regenerated when it was made from exactly --data (its meta records --data's SHA-256), else --data."""
    if not regenerated or not Path(regenerated).is_file():
        return data
    try:
        made_from = json.loads(meta_file(Path(regenerated)).read_text()).get("source_sha256")
    except (OSError, ValueError):
        made_from = None
    if made_from != file_sha256(Path(data)):
        events.message(f"ignoring {regenerated}: it was not made from the current {data} (rerun regenerate)")
        return data
    events.message(f"reading {regenerated} (the verifier's replies to {data})")
    return regenerated


def prepare(args: argparse.Namespace, events: EventLog) -> PrepareReport:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.verifier, trust_remote_code=args.trust_remote_code)
    encoder = TemplateEncoder(tokenizer)
    report = PrepareReport()
    columns: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}

    args.data = choose_data(args.data, args.regenerated, events)
    with open(args.data, encoding="utf-8") as f:
        lines = f.readlines()
    total = len(lines)
    for lineno, line in enumerate(lines, start=1):
        if lineno % 500 == 0 or lineno == total:
            events.progress(lineno, total, unit="rows")
        if not line.strip():
            continue
        report.rows_read += 1
        try:
            messages, split = parse_conversation(line)
        except MalformedRow as e:
            where = f"{args.data}:{lineno}: {e}"
            if args.strict:
                raise MalformedRow(where) from None
            report.malformed += 1
            if len(report.malformed_lines) < MAX_REPORTED_LINES:
                report.malformed_lines.append(where)
            events.message(f"skipping malformed row, {where}")
            continue
        if args.split != "all" and (split or "train") != args.split:
            report.skipped_split += 1
            continue
        rows, fell_back = encoder.rows(messages)
        report.per_turn_fallback += fell_back
        for ids, mask in rows:
            if len(ids) > args.max_seq_len:
                report.truncated += 1
                ids, mask = ids[: args.max_seq_len], mask[: args.max_seq_len]
            if sum(mask) == 0:
                report.no_supervised_tokens += 1
                continue
            columns["input_ids"].append(ids)
            columns["loss_mask"].append(mask)
            columns["seq_len"].append(len(ids))
            report.assistant_tokens += sum(mask)
            report.total_tokens += len(ids)
        if args.max_samples and len(columns["input_ids"]) >= args.max_samples:
            for key in columns:
                del columns[key][args.max_samples :]
            break
    report.rows_kept = len(columns["input_ids"])
    if report.rows_kept == 0:
        raise ValueError(f"no usable rows in {args.data} (read {report.rows_read}, malformed {report.malformed}, split-skipped {report.skipped_split})")
    write_dataset(columns, report, Path(args.output))
    return report


def write_dataset(columns: dict[str, list], report: PrepareReport, output: Path) -> None:
    """Build the dataset in a sibling temp dir, then swap it in: never a half-written OUTPUT."""
    from datasets import Dataset, Features, Sequence, Value
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    features = Features({"input_ids": Sequence(Value("int64")), "loss_mask": Sequence(Value("int64")), "seq_len": Value("int64")})
    dataset = Dataset.from_dict(columns, features=features)
    dataset.set_format(type="torch")  # speculators compares row tensors with torch.equal

    if output.exists():
        foreign = [p.name for p in output.iterdir() if p.name not in OWN_FILES and p.suffix != ".arrow"]
        if foreign:
            raise FileExistsError(f"{output} holds files this stage did not write ({', '.join(sorted(foreign)[:5])}); choose another --output")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        dataset.save_to_disk(str(tmp))
        save_token_frequency_distribution(dataset=dataset, output_path=tmp / "token_freq.pt")
        (tmp / "prepare_report.json").write_text(json.dumps(asdict(report), indent=2))
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        if output.exists():
            os.replace(output, old)
        os.replace(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True, help="verifier directory (its tokenizer and chat template are used)")
    p.add_argument("--data", required=True, help="chat JSONL (messages or ShareGPT conversations)")
    p.add_argument("--output", required=True, help="prepared dataset directory to write")
    p.add_argument("--max-seq-len", type=int, default=2048, help="truncate rows to this many tokens")
    p.add_argument("--split", default="train", help="use rows whose 'split' field is this (rows without one count as train); 'all' uses every row")
    p.add_argument("--max-samples", type=int, default=0, help="stop after this many output rows (0: all)")
    p.add_argument("--strict", action="store_true", help="a malformed row is fatal")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the tokenizer's own code (auto_map)")
    p.add_argument("--regenerated", default=None, help="the regenerate stage's output: read instead of --data when it was made from --data")
    p.add_argument("--events", default=None, help="events.jsonl to append to")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.max_seq_len < 2:
        p.error("--max-seq-len must be at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    def prepare_stage(args: argparse.Namespace, events: EventLog) -> dict:
        started = time.monotonic()
        report = prepare(args, events)
        events.artifact(args.output, kind="prepared")
        return {"seconds": round(time.monotonic() - started, 1), **{k: v for k, v in asdict(report).items() if k != "malformed_lines"}}

    # these explain themselves in one line: no traceback in the log
    return run_stage(STAGE, parse_args(argv), prepare_stage, self_explaining=(MalformedRow, ValueError, FileNotFoundError, FileExistsError))


if __name__ == "__main__":
    sys.exit(main())
