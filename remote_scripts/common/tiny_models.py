"""What the tiny verifiers share (make_tiny_verifier.py, make_stdlib_verifier.py): the special
tokens of their word-level tokenizers, the small Llama they train, its training batches, and the
atomic write of their chat data.
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


def write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
