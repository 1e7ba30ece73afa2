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
from common.recipe import AUTO_MAX_SEQ_LEN, sized_seq_len  # noqa: E402
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
    truncated: int = 0  # rows cut at max_seq_len
    truncated_share: float = 0.0  # of the rows kept
    reply_tokens_cut: int = 0  # assistant tokens those cuts left out of training
    replies_at_budget: int = 0  # rows whose regenerated reply ran to regenerate's --max-new-tokens (cut there)
    longest_row: int = 0  # tokens, before any cut
    max_seq_len: int = 0  # the limit applied (--max-seq-len, or sized to the data when 0)
    per_turn_fallback: int = 0
    assistant_tokens: int = 0
    total_tokens: int = 0
    # what extract will write: total_tokens x (target layers + 1) x hidden x 2 B (bf16), with
    # extract's default 3 target layers (speculators' [2, N//2, N-3])
    hidden_size: int | None = None
    hidden_state_bytes: int | None = None


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
    encoded: list[list[tuple[list[int], list[int]]]] = []  # each conversation's rows, cut once the limit is known
    usable = 0
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
        regenerated = json.loads(line).get("regenerated")
        report.replies_at_budget += isinstance(regenerated, dict) and regenerated.get("finish") == "length"
        encoded.append(rows)
        # --max-samples counts output rows: those with a reply token within the limit
        usable += sum(1 for _, mask in rows if any(mask[: args.max_seq_len or AUTO_MAX_SEQ_LEN]))
        if args.max_samples and usable >= args.max_samples:
            break
    report.longest_row = max((len(ids) for rows in encoded for ids, _ in rows), default=0)
    report.max_seq_len = args.max_seq_len or sized_seq_len(report.longest_row)
    for rows in encoded:
        for ids, mask in rows:
            if len(ids) > report.max_seq_len:
                report.truncated += 1
                report.reply_tokens_cut += sum(mask[report.max_seq_len :])
                ids, mask = ids[: report.max_seq_len], mask[: report.max_seq_len]
            if sum(mask) == 0:
                report.no_supervised_tokens += 1
                continue
            columns["input_ids"].append(ids)
            columns["loss_mask"].append(mask)
            columns["seq_len"].append(len(ids))
            report.assistant_tokens += sum(mask)
            report.total_tokens += len(ids)
    if args.max_samples:
        for key in columns:
            del columns[key][args.max_samples :]
    report.rows_kept = len(columns["input_ids"])
    if report.rows_kept == 0:
        raise ValueError(f"no usable rows in {args.data} (read {report.rows_read}, malformed {report.malformed}, split-skipped {report.skipped_split})")
    report.truncated_share = round(report.truncated / report.rows_kept, 4)
    report.hidden_size = hidden_size(args.verifier, args.trust_remote_code)
    if report.hidden_size:
        report.hidden_state_bytes = report.total_tokens * (DEFAULT_TARGET_LAYERS + 1) * report.hidden_size * 2
    for line in cost_lines(report, args.max_seq_len == 0):
        events.message(line)
    write_dataset(columns, report, Path(args.output))
    return report


DEFAULT_TARGET_LAYERS = 3  # extract's default (speculators' [2, N//2, N-3]), and the last layer beside them


def hidden_size(verifier: str, trust_remote_code: bool) -> int | None:
    """The verifier's width from its config (a multimodal one's text part), or None."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(verifier, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    config = getattr(config, "text_config", None) or config
    return getattr(config, "hidden_size", None)


def cost_lines(report: PrepareReport, sized: bool) -> list[str]:
    """What the prepared data costs downstream, and what was cut: never silently."""
    lines = [f"{report.rows_kept} rows, {report.total_tokens:,} tokens ({report.assistant_tokens:,} in replies)"
             + (f"; extract will write ~{report.hidden_state_bytes / 2**20:,.1f} MiB of hidden states ({report.total_tokens:,} tokens x "
                f"{DEFAULT_TARGET_LAYERS + 1} layers x {report.hidden_size} x 2 B, with extract's default layers)" if report.hidden_state_bytes else "")]
    if report.truncated:
        lines.append(f"{report.truncated} of {report.rows_kept} rows ({100 * report.truncated_share:.1f}%) cut at max_seq_len {report.max_seq_len}"
                     f"{' (sized to the data)' if sized else ''}: {report.reply_tokens_cut:,} reply tokens not trained on; the longest row has "
                     f"{report.longest_row} tokens" + ("" if sized else f" (max_seq_len = 0 sizes the limit to the data, up to {AUTO_MAX_SEQ_LEN})"))
    if report.replies_at_budget:
        lines.append(f"{report.replies_at_budget} of {report.rows_kept} rows have a regenerated reply cut at regenerate's --max-new-tokens "
                     "(raise it, or --loops drop/trim where they loop: regenerate's summary counts the loops)")
    return lines


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
    p.add_argument("--max-seq-len", type=int, default=2048, help=f"truncate rows to this many tokens (0: sized to the data, the longest row up to {AUTO_MAX_SEQ_LEN}; the rows cut are reported)")
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
    if args.max_seq_len == 1 or args.max_seq_len < 0:
        p.error("--max-seq-len must be at least 2 (0: sized to the data)")
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
