"""Build, with no hub access, a tiny Llama-style verifier, its fast tokenizer and a learnable chat language.

The demo and the tests need a verifier that (a) exists without downloads, (b) runs on 2 CPU cores
in seconds and (c) has learned something a draft can learn in turn. This script makes all three:
a language of pseudo-word chains in which every assistant token follows from the one before it
(so a draft can approach an acceptance length of k+1), a word-level fast tokenizer with a chat
template, and a verifier trained briefly on it (`--arch llama`, the default: a small
LlamaForCausalLM; `--arch kimi-k2.5`: a toy Kimi-K2.5, common/tiny_kimi_k25.py). --output gets
the verifier and tiny_language.json (the successor map), --data-out the chat JSONL with its
held-out split. The language, the sizes and why: docs/pipeline.md, "The tiny verifier".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tiny_kimi_k25  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402
from common.tiny_models import ASSISTANT, BOS, END, PAD, SPECIAL_TOKENS, SYSTEM, UNK, USER, ModelSpec, build_model, collate, save_verifier_and_data, train_next_token  # noqa: E402

STAGE = "verifier"

# Renders every turn as "<|role|> content <|end|>"; the generation prompt is "<|assistant|>".
# Whitespace around the content keeps word-level tokenization prefix-stable across turn boundaries.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class LanguageSpec:
    num_words: int = 400
    min_chain: int = 12
    max_chain: int = 32
    seed: int = 0


KIMI_TRAIN_STEPS = 300  # the toy Kimi-K2.5 learns the language more slowly than the small Llama


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 150
    batch_size: int = 32
    lr: float = 1e-2
    seed: int = 0


class ChainLanguage:
    """Pseudo-words, each with one fixed successor (the next word of its chain, or end of turn)."""

    def __init__(self, spec: LanguageSpec):
        rng = random.Random(spec.seed)
        self.words = _pseudo_words(spec.num_words, rng)
        order = list(self.words)
        rng.shuffle(order)
        self.chains: list[list[str]] = []
        i = 0
        while i < len(order):
            n = rng.randint(spec.min_chain, spec.max_chain)
            chain = order[i : i + n]
            if len(chain) < spec.min_chain and self.chains:
                self.chains[-1].extend(chain)  # a short tail joins the previous chain
            else:
                self.chains.append(chain)
            i += n
        self.successor: dict[str, str | None] = {}
        self.position: dict[str, tuple[int, int]] = {}
        for c, chain in enumerate(self.chains):
            for j, word in enumerate(chain):
                self.successor[word] = chain[j + 1] if j + 1 < len(chain) else None
                self.position[word] = (c, j)

    def reply_to(self, last_user_word: str) -> list[str]:
        """The assistant's reply: the chain after `last_user_word`, to the chain's end."""
        c, j = self.position[last_user_word]
        return self.chains[c][j + 1 :]

    def conversation(self, rng: random.Random, turns: int) -> list[dict[str, str]]:
        messages = []
        for _ in range(turns):
            prompt = [rng.choice(self.words) for _ in range(rng.randint(2, 8))]
            # The last user word sits in the first half of its chain: replies are >= 6 words long.
            chain = rng.choice(self.chains)
            prompt.append(chain[rng.randrange(0, len(chain) // 2)])
            messages.append({"role": "user", "content": " ".join(prompt)})
            messages.append({"role": "assistant", "content": " ".join(self.reply_to(prompt[-1]))})
        return messages

    def to_json(self) -> dict:
        return {"chains": self.chains, "end_of_turn": END}


def _pseudo_words(n: int, rng: random.Random) -> list[str]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))))
    return sorted(words)


def build_tokenizer(words: list[str]):
    """A word-level fast tokenizer over `words` plus SPECIAL_TOKENS, with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab[w] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins word-level tokens with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=END,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM],
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def encode_conversation(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a mask of its assistant tokens (content + <|end|>).

    Built directly from the word-level layout (fast), and checked once against the chat template
    by `check_encoding` so the two cannot drift apart.
    """
    ids = [tokenizer.bos_token_id]
    mask = [0]
    role_ids = {"user": tokenizer.convert_tokens_to_ids(USER), "assistant": tokenizer.convert_tokens_to_ids(ASSISTANT), "system": tokenizer.convert_tokens_to_ids(SYSTEM)}
    for m in messages:
        content = tokenizer.convert_tokens_to_ids(m["content"].split())
        is_assistant = int(m["role"] == "assistant")
        ids += [role_ids[m["role"]], *content, tokenizer.eos_token_id]
        mask += [0] + [is_assistant] * (len(content) + 1)
    return ids, mask


def check_encoding(tokenizer, messages: list[dict[str, str]]) -> None:
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    via_template = tokenizer(text, add_special_tokens=False)["input_ids"]
    direct, _ = encode_conversation(tokenizer, messages)
    if via_template != direct:
        raise RuntimeError("the chat template and the direct encoding disagree; fix encode_conversation")


def train(model, rows: list[tuple[list[int], list[int]]], heldout: list[tuple[list[int], list[int]]], spec: TrainSpec, events: EventLog) -> dict[str, float]:
    """Next-token training on assistant tokens only (the user words are random noise)."""
    _, seconds, loss = train_next_token(model, rows, steps=spec.steps, batch_size=spec.batch_size, lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.98),
                                        seed=spec.seed, events=events)
    return {"train_seconds": seconds, "heldout_token_accuracy": assistant_accuracy(model, heldout), "final_loss": round(loss, 4)}


def assistant_accuracy(model, rows: list[tuple[list[int], list[int]]]) -> float:
    """Greedy next-token accuracy of the model on assistant tokens of `rows` (teacher forcing)."""
    import torch

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            input_ids, labels, attention = collate(rows[i : i + 64], model.config.pad_token_id)
            logits = model(input_ids=input_ids, attention_mask=attention).logits
            pred = logits[:, :-1].argmax(-1)
            target = labels[:, 1:]
            valid = target != -100
            correct += int((pred[valid] == target[valid]).sum())
            total += int(valid.sum())
    return round(correct / max(1, total), 4)


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="verifier directory to write")
    p.add_argument("--data-out", required=True, help="chat JSONL to write (train + heldout rows)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-words", type=int, default=LanguageSpec.num_words)
    p.add_argument("--conversations", type=int, default=1000, help="train conversations")
    p.add_argument("--heldout", type=int, default=64, help="held-out conversations (split=heldout)")
    p.add_argument("--max-turns", type=int, default=3, help="user/assistant turn pairs per conversation (1..N)")
    p.add_argument("--arch", choices=["llama", tiny_kimi_k25.ARCH], default="llama", help="llama: the small default; kimi-k2.5: a toy of Kimi-K2.5 (common/tiny_kimi_k25.py: multimodal wrapper, DeepSeek-V3 MoE text model)")
    p.add_argument("--layout", choices=tiny_kimi_k25.LAYOUTS, default="save_pretrained", help="kimi-k2.5 only: the checkpoint's key names and config (common/tiny_kimi_k25.py)")
    p.add_argument("--train-steps", type=int, default=None, help=f"0 leaves the verifier untrained (default: {TrainSpec.steps}; {KIMI_TRAIN_STEPS} for kimi-k2.5)")
    p.add_argument("--batch-size", type=int, default=TrainSpec.batch_size)
    p.add_argument("--lr", type=float, default=TrainSpec.lr)
    p.add_argument("--hidden-size", type=int, default=None, help=f"default: {ModelSpec.hidden_size}; 128 for kimi-k2.5")
    p.add_argument("--num-layers", type=int, default=ModelSpec.num_layers)
    p.add_argument("--num-heads", type=int, default=ModelSpec.num_heads)
    p.add_argument("--intermediate-size", type=int, default=ModelSpec.intermediate_size)
    p.add_argument("--tie-word-embeddings", action="store_true", help="llama only: tie lm_head to the input embeddings (as SmolLM2 does)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default; see run())")
    p.add_argument("--events", default=None, help="events.jsonl to append to")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, parse_args(argv), run)


def run(args: argparse.Namespace, events: EventLog) -> dict:
    import torch

    # One thread by default: this model's matmuls are too small to gain from two, and on a busy
    # 2-core box two OpenMP threads spin against other processes (measured: 0.30 s/step with 1
    # thread, 8.0 s/step with 2 while another stage ran).
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tie_word_embeddings and args.arch != "llama":
        raise ValueError("--tie-word-embeddings is for --arch llama")
    if args.layout != "save_pretrained" and args.arch != tiny_kimi_k25.ARCH:
        raise ValueError(f"--layout {args.layout} is for --arch {tiny_kimi_k25.ARCH}")
    if args.num_layers < 7:
        raise ValueError(f"--num-layers {args.num_layers}: speculators' default target layers need at least 7")
    t0 = time.monotonic()
    lang = ChainLanguage(LanguageSpec(num_words=args.num_words, seed=args.seed))
    rng = random.Random(args.seed + 1)
    total = args.conversations + args.heldout
    conversations = [lang.conversation(rng, rng.randint(1, args.max_turns)) for _ in range(total)]
    rows = [
        {"id": f"tiny-{i}", "split": "train" if i < args.conversations else "heldout", "messages": msgs}
        for i, msgs in enumerate(conversations)
    ]

    tokenizer = build_tokenizer(lang.words)
    check_encoding(tokenizer, conversations[0])
    encoded = [encode_conversation(tokenizer, msgs) for msgs in conversations]
    train_rows, heldout_rows = encoded[: args.conversations], encoded[args.conversations :]
    events.message(f"language: {len(lang.words)} words in {len(lang.chains)} chains; {len(train_rows)} train + {len(heldout_rows)} heldout conversations")

    if args.arch == tiny_kimi_k25.ARCH:
        spec = tiny_kimi_k25.KimiSpec(num_layers=args.num_layers)
        model = tiny_kimi_k25.build_model(replace(spec, hidden_size=args.hidden_size or spec.hidden_size), tokenizer, args.seed)
    else:
        model = build_model(ModelSpec(args.hidden_size or ModelSpec.hidden_size, args.num_layers, args.num_heads, args.intermediate_size, tie_word_embeddings=args.tie_word_embeddings), tokenizer, args.seed)
    train_steps = args.train_steps if args.train_steps is not None else (KIMI_TRAIN_STEPS if args.arch == tiny_kimi_k25.ARCH else TrainSpec.steps)
    n_params = sum(p.numel() for p in model.parameters())
    events.message(f"verifier: {type(model).__name__}, {n_params / 1e6:.2f}M parameters, {args.num_layers} layers, hidden {model.get_output_embeddings().in_features}")
    summary: dict = {"parameters": n_params, "dtype": "float32", "attn_implementation": "sdpa", "arch": args.arch}
    if train_steps > 0:
        summary.update(train(model, train_rows, heldout_rows, TrainSpec(train_steps, args.batch_size, args.lr, args.seed), events))
        events.metric(train_steps, heldout_token_accuracy=summary["heldout_token_accuracy"])

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    kimi = args.arch == tiny_kimi_k25.ARCH
    if kimi:
        summary["layout"] = args.layout
    (out / "tiny_language.json").write_text(json.dumps({**lang.to_json(), "spec": asdict(LanguageSpec(args.num_words, seed=args.seed))}))
    save_verifier_and_data(model, tokenizer, out, Path(args.data_out), rows, events,
                           save_model=(lambda path: tiny_kimi_k25.save(model, path, args.layout)) if kimi else None)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
