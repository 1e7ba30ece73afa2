"""What the tiny verifiers share (make_tiny_verifier.py, make_stdlib_verifier.py): the special
tokens of their word-level tokenizers, the small Llama they train, its training batches and loop,
and how the made verifier and its chat data are written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# Special tokens, in id order (ids 0..len-1).
PAD, UNK, BOS, END, USER, ASSISTANT, SYSTEM = "<pad>", "<unk>", "<bos>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = [PAD, UNK, BOS, END, USER, ASSISTANT, SYSTEM]


@dataclass(frozen=True)
class ModelSpec:
    hidden_size: int = 64
    num_layers: int = 8
    num_heads: int = 2  # head size 32: the smallest vLLM's CPU attention serves (16 is not)
    intermediate_size: int = 128
    max_positions: int = 512
    tie_word_embeddings: bool = False


def build_model(spec: ModelSpec, tokenizer, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Untied by default; --tie-word-embeddings ties them as SmolLM2 and other small models do
        # (the checkpoint then holds no lm_head.weight: speculators 0.9.0 takes the embeddings).
        tie_word_embeddings=spec.tie_word_embeddings,
        dtype="float32",
    )
    # sdpa: exact, fast on CPU, and it takes the padding masks the extractor builds.
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def collate(batch, pad_id: int):
    """Right-padded ids, labels (-100 outside assistant tokens and on padding) and attention mask."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (ids, mask) in enumerate(batch):
        t = torch.tensor(ids)
        input_ids[r, : len(ids)] = t
        attention[r, : len(ids)] = 1
        labels[r, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, torch.tensor(-100))
    return input_ids, labels, attention


def train_next_token(model, rows: list[tuple[list[int], list[int]]], *, steps: int, batch_size: int, lr: float, weight_decay: float,
                     betas: tuple[float, float], seed: int, events, device: str = "cpu", max_seconds: float = 0.0) -> tuple[int, float, float]:
    """Next-token training on `rows` ((ids, mask): the mask's ones are the tokens in the loss),
    AdamW with a 5% warm-up then a cosine decay, bf16 autocast on CUDA, up to `max_seconds`
    (0: no bound). Returns (steps done, seconds, the last loss)."""
    import math
    import random
    import time

    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)
    model.train()
    started = time.monotonic()
    step, loss = 0, float("nan")
    for step in range(1, steps + 1):
        batch = rng.sample(rows, min(batch_size, len(rows)))
        input_ids, labels, attention = (t.to(device) for t in collate(batch, model.config.pad_token_id))
        with autocast:
            out = model(input_ids=input_ids, attention_mask=attention, labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps:
            loss = out.loss.item()
            events.metric(step, loss=round(loss, 4), lr=float(f"{sched.get_last_lr()[0]:.4g}"))
            events.progress(step, steps, unit="steps")
        if max_seconds and time.monotonic() - started > max_seconds:
            events.message(f"stopping at step {step} of {steps}: --max-minutes reached")
            loss = out.loss.item()
            break
    return step, round(time.monotonic() - started, 1), loss


def write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def save_verifier_and_data(model, tokenizer, out: Path, data_out: Path, rows: list[dict], events, save_model=None) -> None:
    """The made verifier in `out` (its generation config pads and stops with the tokenizer's
    tokens; `save_model(out)` where it is not save_pretrained's layout) and its chat rows in
    `data_out`, both named as artifacts."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    (save_model or model.save_pretrained)(out)
    tokenizer.save_pretrained(out)
    write_jsonl_atomic(data_out, rows)
    events.artifact(str(out), kind="verifier")
    events.artifact(str(data_out), kind="data")
