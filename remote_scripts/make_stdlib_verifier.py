"""Build, with no hub access, a real verifier of real text: a Llama model of the Python standard library.

The tiny demo language saturates (every draft proposal is accepted), so it cannot tell one draft
recipe from another; this verifier's outputs are real, imperfect code. It trains a byte-level BPE
tokenizer and a LlamaForCausalLM on this Python's standard library (test directories left out;
each file train or held-out by a hash of its path), reports the held-out loss per token, and
writes prompts only (a file's imports, then one function's signature and docstring) for the
regenerate stage to answer. bench/quality/run.py uses it. The text, the tokenizer, the prompts,
the sizes and the outputs: docs/pipeline.md, "The stdlib verifier".
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# torch's OpenMP threads busy-wait by default: on a shared few-core box that makes every op crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.events import EventLog, run_stage  # noqa: E402
from common.tiny_models import ASSISTANT, BOS, END, PAD, SPECIAL_TOKENS, SYSTEM, USER, ModelSpec, build_model, save_verifier_and_data, train_next_token  # noqa: E402

STAGE = "verifier"
TEST_DIRS = {"test", "tests", "idle_test"}
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
MAX_IMPORT_CHARS = 1200  # a file's imports can run to pages: keep the first lines of them


@dataclass(frozen=True)
class Size:
    vocab_size: int
    model: ModelSpec
    seq_len: int
    steps: int
    batch_size: int
    lr: float


SIZES = {
    # ~1.8M parameters, 500 steps of 8 x 128 tokens: a few minutes on 2 idle cores.
    "cpu": Size(2048, ModelSpec(hidden_size=128, num_layers=8, num_heads=4, intermediate_size=256, max_positions=1024), 128, 500, 8, 3e-3),
    # ~110M parameters (12 x 768, vocab 16k), 3000 steps of 32 x 512 tokens: a few minutes in bf16 on one H200.
    "gpu": Size(16384, ModelSpec(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=2048, max_positions=2048), 512, 3000, 32, 6e-4),
}


# ---------------------------------------------------------------------------------------------
# The text and its split


def stdlib_files(root: Path) -> list[Path]:
    """The library's .py files outside test directories, sorted by relative path."""
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in TEST_DIRS and x not in ("site-packages", "__pycache__"))
        files += [Path(d) / n for n in names if n.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relative_path: str, percent: float) -> bool:
    """Held-out by a hash of the path: stable across machines and runs, independent of the file set."""
    bucket = int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % 10000
    return bucket < percent * 100


@dataclass(frozen=True)
class FunctionPrompt:
    source: str  # relative path:line
    prompt: str  # the file's imports, then the signature and docstring
    body: str  # the rest of the function


def function_prompts(relative_path: str, text: str) -> list[FunctionPrompt]:
    """One prompt per function or method that has a docstring and a body after it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    imports = "".join("".join(lines[n.lineno - 1 : n.end_lineno]) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    if len(imports) > MAX_IMPORT_CHARS:
        imports = imports[: imports.rfind("\n", 0, MAX_IMPORT_CHARS) + 1]
    out = []

    def visit(nodes, header: str) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef) and not header:
                visit(node.body, "".join(lines[node.lineno - 1 : node.body[0].lineno - 1]) if node.body else "")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) and len(node.body) > 1:
                start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
                doc_end = node.body[0].end_lineno
                prompt = (imports + "\n\n" if imports else "") + header + "".join(lines[start:doc_end])
                body = "".join(lines[doc_end : node.end_lineno])
                if body.strip():
                    out.append(FunctionPrompt(f"{relative_path}:{node.lineno}", prompt, body))

    visit(tree.body, "")
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizer and training rows


def build_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on `texts`, wrapped with the special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=END, pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM], model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def chat_ids(tokenizer, prompt: str, body: str | None) -> list[int]:
    """The rendered conversation's ids, built from the pieces (checked once against the template)."""
    ids = [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids(USER), *tokenizer(prompt, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(ASSISTANT)]
    if body is not None:
        ids += [*tokenizer(body, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    return ids


def check_chat_ids(tokenizer, fp: FunctionPrompt) -> None:
    messages = [{"role": "user", "content": fp.prompt}, {"role": "assistant", "content": fp.body}]
    via_template = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    if via_template != chat_ids(tokenizer, fp.prompt, fp.body):
        raise RuntimeError("the chat template and the piecewise encoding disagree; fix chat_ids")


def text_chunks(tokenizer, texts: list[str], seq_len: int) -> list[list[int]]:
    """The texts as one stream (each file after <bos>), cut into rows of seq_len tokens."""
    stream: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts):
        stream += [tokenizer.bos_token_id, *enc.ids]
    return [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


# ---------------------------------------------------------------------------------------------
# Training


def train_lm(model, rows: list[list[int]], steps: int, batch_size: int, lr: float, device: str, seed: int, max_seconds: float, events: EventLog) -> dict:
    """Next-token training on every token of `rows`."""
    done, seconds, loss = train_next_token(model, [(r, [1] * len(r)) for r in rows], steps=steps, batch_size=batch_size, lr=lr, weight_decay=0.01,
                                           betas=(0.9, 0.95), seed=seed, events=events, device=device, max_seconds=max_seconds)
    return {"train_steps": done, "train_seconds": seconds, "final_train_loss": round(float(loss), 4)}


def heldout_loss(model, rows: list[list[int]], device: str, batch_size: int = 16) -> float:
    """Mean next-token loss (nats per token) over `rows`."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            ids = torch.tensor(rows[i : i + batch_size], device=device)
            logits = model(input_ids=ids).logits[:, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"))
            count += ids[:, 1:].numel()
    return total / max(1, count)


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="verifier directory to write")
    p.add_argument("--data-out", required=True, help="chat JSONL of prompts to write (train + heldout rows)")
    p.add_argument("--size", choices=sorted(SIZES), default="cpu")
    p.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"], help="the standard library's directory (default: this Python's)")
    p.add_argument("--heldout-percent", type=float, default=10.0, help="share of files held out, by a hash of their path")
    p.add_argument("--train-prompts", type=int, default=512, help="prompts from training files in --data-out")
    p.add_argument("--heldout-prompts", type=int, default=64, help="prompts from held-out files in --data-out")
    p.add_argument("--max-prompt-tokens", type=int, default=384, help="skip prompts longer than this")
    for name in ("vocab-size", "seq-len", "steps", "batch-size", "hidden-size", "num-layers", "num-heads", "intermediate-size"):
        p.add_argument(f"--{name}", type=int, default=None, help="override the size's value")
    p.add_argument("--lr", type=float, default=None, help="override the size's value")
    p.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this long (0: no limit)")
    p.add_argument("--heldout-chunks", type=int, default=200, help="held-out chunks the loss is measured on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--events", default=None, help="events.jsonl to append to")
    return p.parse_args(argv)


def resolve_size(args: argparse.Namespace) -> Size:
    base = SIZES[args.size]
    model = ModelSpec(
        hidden_size=args.hidden_size or base.model.hidden_size, num_layers=args.num_layers or base.model.num_layers,
        num_heads=args.num_heads or base.model.num_heads, intermediate_size=args.intermediate_size or base.model.intermediate_size,
        max_positions=base.model.max_positions,
    )
    if model.num_layers < 7:
        raise ValueError(f"--num-layers {model.num_layers}: speculators' default target layers need at least 7")
    return Size(args.vocab_size or base.vocab_size, model, args.seq_len or base.seq_len, args.steps if args.steps is not None else base.steps, args.batch_size or base.batch_size, args.lr or base.lr)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, parse_args(argv), run, self_explaining=(ValueError, FileNotFoundError))


def run(args: argparse.Namespace, events: EventLog) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    size = resolve_size(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    root = Path(args.stdlib)
    if not root.is_dir():
        raise FileNotFoundError(f"--stdlib {root}: no such directory")
    split: dict[str, list[str]] = {"train": [], "heldout": []}
    texts: dict[str, list[str]] = {"train": [], "heldout": []}
    prompts: dict[str, list[FunctionPrompt]] = {"train": [], "heldout": []}
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        part = "heldout" if is_heldout(rel, args.heldout_percent) else "train"
        split[part].append(rel)
        texts[part].append(text)
        prompts[part] += function_prompts(rel, text)
    if not split["train"] or not split["heldout"]:
        raise ValueError(f"{root}: {len(split['train'])} training and {len(split['heldout'])} held-out files; both must be non-empty")
    events.message(f"stdlib {root}: {len(split['train'])} training files, {len(split['heldout'])} held-out; functions {len(prompts['train'])} / {len(prompts['heldout'])}")

    tokenizer = build_tokenizer(texts["train"], size.vocab_size)
    check_chat_ids(tokenizer, prompts["train"][0])
    rows = text_chunks(tokenizer, texts["train"], size.seq_len)
    chat_rows = [chat_ids(tokenizer, fp.prompt, fp.body)[: size.seq_len] for fp in prompts["train"]]
    heldout_rows = text_chunks(tokenizer, texts["heldout"], size.seq_len)
    heldout_rows = random.Random(args.seed).sample(heldout_rows, min(args.heldout_chunks, len(heldout_rows)))
    events.message(f"tokenizer: {len(tokenizer)} tokens; {len(rows)} text chunks + {len(chat_rows)} chat rows of <= {size.seq_len} tokens")

    model = build_model(size.model, tokenizer, args.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    events.message(f"verifier: {n_params / 1e6:.1f}M parameters ({size.model.num_layers} x {size.model.hidden_size}) on {device}; {size.steps} steps x {size.batch_size} rows")
    summary: dict = {"size": args.size, "parameters": n_params, "vocab_size": len(tokenizer), "device": device}
    summary.update(train_lm(model, rows + chat_rows, size.steps, size.batch_size, size.lr, device, args.seed, args.max_minutes * 60, events))
    summary["heldout_loss_per_token"] = round(heldout_loss(model, heldout_rows, device), 4)
    events.metric(summary["train_steps"], heldout_loss_per_token=summary["heldout_loss_per_token"])

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").to(torch.float32)
    (out / "stdlib_split.json").write_text(json.dumps({"root": str(root), "heldout_percent": args.heldout_percent, **split, "summary": summary, "size": asdict(size)}, indent=1))

    data = []
    for part, count in (("train", args.train_prompts), ("heldout", args.heldout_prompts)):
        chosen = [fp for fp in random.Random(args.seed).sample(prompts[part], len(prompts[part])) if len(chat_ids(tokenizer, fp.prompt, None)) <= args.max_prompt_tokens][:count]
        data += [{"id": f"stdlib-{part}-{i}", "split": part, "source": fp.source, "messages": [{"role": "user", "content": fp.prompt}]} for i, fp in enumerate(chosen)]
    save_verifier_and_data(model, tokenizer, out, Path(args.data_out), data, events)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
